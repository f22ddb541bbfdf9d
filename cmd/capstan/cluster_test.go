package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/execution"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/demo"
)

// spawn runs capstan args until the test ends without waiting for it.
func spawn(t *testing.T, env []string, args ...string) *daemon {
	t.Helper()
	d := &daemon{cmd: exec.Command(bin, args...), exited: make(chan struct{})}
	d.cmd.Stdout, d.cmd.Stderr = &d.out, &d.out
	d.cmd.Env = append(os.Environ(), env...)
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.err = d.cmd.Wait(); close(d.exited) }()
	t.Cleanup(func() { d.cleanup(t) })
	return d
}

// waitOutput waits until the process has printed ready.
func (d *daemon) waitOutput(t *testing.T, ready string) {
	t.Helper()
	deadline := time.After(guard)
	for !strings.Contains(d.out.String(), ready) {
		select {
		case <-d.exited:
			t.Fatalf("capstan %s exited (%v) before %q:\n%s", strings.Join(d.cmd.Args[1:], " "), d.err, ready, d.out.String())
		case <-deadline:
			t.Fatalf("capstan %s: no %q:\n%s", strings.Join(d.cmd.Args[1:], " "), ready, d.out.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// kill ends the process with SIGKILL, as a lost machine would.
func (d *daemon) kill(t *testing.T) {
	t.Helper()
	if err := d.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-d.exited
}

// serverNode is one `capstan server` of a cluster, restartable on its store.
type serverNode struct {
	name string
	args []string
	d    *daemon
}

const serverReady = "capstan server listening on"

// startServerCluster starts three `capstan server` processes routed to each
// other, as the three commands of docs/operations.md do, and returns them and the URL
// list clients are given.
func startServerCluster(t *testing.T, extra ...string) ([]*serverNode, string) {
	t.Helper()
	var clientPorts, routePorts []int
	for range 3 {
		clientPorts = append(clientPorts, freePort(t))
		routePorts = append(routePorts, freePort(t))
	}
	var nodes []*serverNode
	var urls []string
	for i := range 3 {
		var routes []string
		for j, p := range routePorts {
			if j != i {
				routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", p))
			}
		}
		n := &serverNode{name: fmt.Sprintf("n%d", i+1), args: []string{"server",
			"--name", fmt.Sprintf("n%d", i+1), "--store", t.TempDir(),
			"--listen", fmt.Sprintf("127.0.0.1:%d", clientPorts[i]),
			"--cluster", fmt.Sprintf("127.0.0.1:%d", routePorts[i]),
			"--routes", strings.Join(routes, ",")}}
		n.args = append(n.args, extra...)
		nodes = append(nodes, n)
		urls = append(urls, fmt.Sprintf("nats://127.0.0.1:%d", clientPorts[i]))
	}
	// All three at once: each provisions once the cluster has formed.
	for _, n := range nodes {
		n.d = spawn(t, nil, n.args...)
	}
	for _, n := range nodes {
		n.d.waitOutput(t, serverReady)
	}
	return nodes, strings.Join(urls, ",")
}

// restart starts a killed node again on its store and ports.
func (n *serverNode) restart(t *testing.T) {
	t.Helper()
	n.d = spawn(t, nil, n.args...)
	n.d.waitOutput(t, serverReady)
}

var clusterStreams = append(broker.NewNames("").Streams(), demo.Streams...)

// streamLeader returns the name of the server leading the stream.
func streamLeader(ctx context.Context, js jetstream.JetStream, stream string) string {
	for ctx.Err() == nil {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		s, err := js.Stream(rctx, stream)
		cancel()
		if err == nil && s.CachedInfo().Cluster != nil && s.CachedInfo().Cluster.Leader != "" {
			return s.CachedInfo().Cluster.Leader
		}
		time.Sleep(100 * time.Millisecond)
	}
	return ""
}

// waitAllCurrent waits until every stream has a leader and all its replicas
// current: a restarted node has caught up.
func waitAllCurrent(t *testing.T, ctx context.Context, js jetstream.JetStream) {
	t.Helper()
	for _, name := range clusterStreams {
		for {
			rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			s, err := js.Stream(rctx, name)
			cancel()
			if err == nil {
				ci := s.CachedInfo().Cluster
				current := 0
				for _, r := range ci.Replicas {
					if r.Current && !r.Offline {
						current++
					}
				}
				if ci.Leader != "" && current == 2 {
					break
				}
			}
			select {
			case <-ctx.Done():
				t.Fatalf("stream %s did not catch up: %v", name, err)
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
}

func TestClusterProcesses_ServersKilledOneAfterAnother_OneEnvelopeAndAtMostOneEmailPerExecution(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("cluster of processes")
	}
	const n = 2000
	nodes, urls := startServerCluster(t)
	env := []string{"CAPSTAN_NATS_URL=" + urls}
	var workers []*daemon
	for _, id := range []string{"worker-1", "worker-2"} {
		w := spawn(t, env, "worker", "--id", id, "--concurrency", "64", "--lease", "10s")
		w.waitOutput(t, "worker started")
		workers = append(workers, w)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*guard)
	defer cancel()
	nc := connect(t, urls)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range clusterStreams {
		s, err := js.Stream(ctx, name)
		if err != nil || s.CachedInfo().Config.Replicas != 3 {
			t.Fatalf("stream %s: %v, want 3 replicas", name, err)
		}
	}
	client, err := executor.NewClient(nc, executor.ClientConfig{Actor: envelope.Actor{Kind: "user", ID: "test"}})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()

	ids := make([]string, n)
	for i := range ids {
		ids[i] = envelope.NewExecutionID()
	}
	envs := make([]*envelope.Envelope, n)
	errs := make([]error, n)
	var done atomic.Int64
	// Batches of 50 calls, one a second: the run spans the losses and
	// restarts of two server processes, whose restarts take seconds.
	const producers, batch = 8, 50
	next := make(chan int)
	go func() {
		defer close(next)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for start := 0; start < n; start += batch {
			next <- start
			<-tick.C
		}
	}()
	var wg sync.WaitGroup
	for range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for start := range next {
				end := min(start+batch, n)
				var reqs []executor.Request
				for i := start; i < end; i++ {
					reqs = append(reqs, executor.Request{CapabilityID: "email.send",
						Input:   demo.EmailInput{To: fmt.Sprintf("user%d@example.com", i), Subject: "hello", HoldMs: i % 101},
						Options: []executor.CallOption{executor.WithID(ids[i])}})
				}
				got, gotErrs := client.CallMany(ctx, reqs)
				copy(envs[start:end], got)
				copy(errs[start:end], gotErrs)
				done.Add(int64(end - start))
			}
		}()
	}

	// SIGKILL the node leading the executions bucket at 10%, start it again
	// at 25%, wait until it has caught up; then SIGKILL another node at 55%
	// and start it again at 75%.
	at := func(frac float64) bool {
		for done.Load() < int64(frac*n) {
			if ctx.Err() != nil {
				return false
			}
			time.Sleep(50 * time.Millisecond)
		}
		return true
	}
	byName := func(name string) *serverNode {
		for _, node := range nodes {
			if node.name == name {
				return node
			}
		}
		t.Errorf("no node named %q", name)
		return nodes[0]
	}
	// How far the run has got, every 5 s, until the calls have returned: it
	// is joined before the test goes on, so it never logs after the test.
	stopProgress, progressDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(progressDone)
		tick := time.NewTicker(5 * time.Second)
		defer tick.Stop()
		for {
			select {
			case <-stopProgress:
				return
			case <-ctx.Done():
				return
			case <-tick.C:
				t.Logf("%s: %d/%d done", time.Now().Format("15:04:05"), done.Load(), n)
			}
		}
	}()
	chaosDone := make(chan struct{})
	go func() {
		defer close(chaosDone)
		if !at(0.1) {
			return
		}
		first := byName(streamLeader(ctx, js, "KV_CAPSTAN_EXECUTIONS"))
		t.Logf("%d/%d done: SIGKILL %s, leader of KV_CAPSTAN_EXECUTIONS", done.Load(), n, first.name)
		first.d.kill(t)
		at(0.25)
		t.Logf("%d/%d done: restarting %s", done.Load(), n, first.name)
		first.restart(t)
		waitAllCurrent(t, ctx, js)
		if !at(0.55) {
			return
		}
		second := byName(streamLeader(ctx, js, "KV_CAPSTAN_ENVELOPES"))
		if second == first {
			second = byName(streamLeader(ctx, js, "CAPSTAN_EXEC"))
		}
		if second == first {
			second = nodes[(indexOf(nodes, first)+1)%len(nodes)]
		}
		t.Logf("%d/%d done: SIGKILL %s", done.Load(), n, second.name)
		second.d.kill(t)
		at(0.75)
		t.Logf("%d/%d done: restarting %s", done.Load(), n, second.name)
		second.restart(t)
	}()
	wg.Wait()
	<-chaosDone
	close(stopProgress)
	<-progressDone
	if ctx.Err() != nil {
		diagnose(t, js, urls, workers, ids, errs)
		t.Fatalf("the run did not finish: %d of %d calls returned", done.Load(), n)
	}

	statuses := map[string]int{}
	completed := map[string]bool{}
	for i, id := range ids {
		if errs[i] != nil || envs[i] == nil || envs[i].ExecutionID != id {
			t.Fatalf("call %d (%s): %+v, err %v", i, id, envs[i], errs[i])
		}
		key := string(envs[i].Status)
		if envs[i].Error != nil {
			key += "/" + string(envs[i].Error.Code)
		}
		statuses[key]++
		completed[id] = envs[i].Status == envelope.StatusCompleted
	}
	t.Logf("envelopes by outcome: %v", statuses)

	readCtx, cancelRead := context.WithTimeout(context.Background(), guard)
	defer cancelRead()
	envelopesStored(t, readCtx, js, n)
	sent := outboxCounts(t, readCtx, js)
	for id, k := range sent {
		if k > 1 {
			t.Errorf("execution %s sent %d emails", id, k)
		}
	}
	calls := readCalls(t, readCtx, js)
	ran := map[string]int{}
	attempts := map[string]map[int]int{}
	for _, c := range calls {
		ran[c.ExecutionID]++
		if attempts[c.ExecutionID] == nil {
			attempts[c.ExecutionID] = map[int]int{}
		}
		attempts[c.ExecutionID][c.Attempt]++
	}
	reattempted := 0
	for id, k := range ran {
		if sent[id] > k {
			t.Errorf("execution %s sent %d emails in %d recorded handler calls", id, sent[id], k)
		}
		if k == 1 {
			continue
		}
		// A second call is an attempt the takeover rules allow only on an
		// authoritative answer: the reconciler proved the one before it
		// absent (a worker cut off from the store by a node's loss lost its
		// lease with its handler in flight; email.send's outbox, create-only
		// under the idempotency key, refuses the lost attempt's late email).
		// Never twice the same attempt, never one on a guess.
		absent := provedAbsent(t, readCtx, client, id)
		for attempt, n := range attempts[id] {
			if n > 1 {
				t.Errorf("execution %s ran attempt %d's handler %d times", id, attempt, n)
			}
			if attempt > 1 && !slices.Contains(absent, attempt) {
				t.Errorf("execution %s ran attempt %d without a proof that the one before took no effect (calls by attempt %v)",
					id, attempt, attempts[id])
			}
		}
		reattempted++
	}
	for id, ok := range completed {
		if ok && sent[id] != 1 {
			t.Errorf("completed execution %s sent %d emails in %d handler calls, want 1", id, sent[id], ran[id])
		}
	}
	t.Logf("emails sent: %d, handler calls: %d, executions attempted again after a proof of absence: %d", len(sent), len(calls), reattempted)
}

// provedAbsent lists the attempts of an execution that its trail says
// started because a reconciler proved the attempt before them absent.
func provedAbsent(t *testing.T, ctx context.Context, c *executor.Client, id string) []int {
	t.Helper()
	trail, err := c.Trail(ctx, id)
	if err != nil {
		t.Fatalf("trail of %s: %v", id, err)
	}
	var out []int
	for _, ev := range trail {
		if ev.Type == audit.EventRetried && fmt.Sprint(ev.Data["reason"]) == "reconciled-absent" {
			n, _ := strconv.Atoi(fmt.Sprint(ev.Data["attempt"]))
			out = append(out, n)
		}
	}
	return out
}

func indexOf(nodes []*serverNode, n *serverNode) int {
	for i, m := range nodes {
		if m == n {
			return i
		}
	}
	return -1
}

// envelopesStored checks that the envelopes stream holds exactly n
// envelopes, one write each. Right after a node restart, the leader that
// answers may not have applied every committed write to its store yet: its
// count is read again until it is n, or ctx ends. A count beyond n, a
// second write, fails at once.
func envelopesStored(t *testing.T, ctx context.Context, js jetstream.JetStream, n int) {
	t.Helper()
	var msgs, last uint64
	for {
		st, err := js.Stream(ctx, "KV_CAPSTAN_ENVELOPES")
		var info *jetstream.StreamInfo
		if err == nil {
			info, err = st.Info(ctx)
		}
		if err == nil {
			msgs, last = info.State.Msgs, info.State.LastSeq
			if msgs == uint64(n) && last == uint64(n) {
				return
			}
			if last > uint64(n) {
				break
			}
		}
		if ctx.Err() != nil {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(250 * time.Millisecond):
		}
	}
	t.Fatalf("envelope stream holds %d messages up to sequence %d, want exactly %d", msgs, last, n)
}

// outboxCounts counts the outbox's emails per execution id.
func outboxCounts(t *testing.T, ctx context.Context, js jetstream.JetStream) map[string]int {
	t.Helper()
	// Right after a node restart the stream's group may still be electing a
	// leader ("no responders"): read again, from the start, until ctx ends.
	for {
		out, err := readOutbox(ctx, js)
		if err == nil {
			return out
		}
		if ctx.Err() != nil {
			t.Fatalf("read outbox: %v", err)
		}
		t.Logf("read outbox: %v; reading again", err)
		select {
		case <-ctx.Done():
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// readCalls reads the calls stream, again while a restarted node's stream
// group elects its leader, until ctx ends.
func readCalls(t *testing.T, ctx context.Context, js jetstream.JetStream) []demo.HandlerCall {
	t.Helper()
	for {
		calls, err := demo.ReadCalls(ctx, js)
		if err == nil {
			return calls
		}
		if ctx.Err() != nil {
			t.Fatalf("read the calls stream: %v", err)
		}
		t.Logf("read the calls stream: %v; reading again", err)
		select {
		case <-ctx.Done():
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func readOutbox(ctx context.Context, js jetstream.JetStream) (map[string]int, error) {
	s, err := js.Stream(ctx, demo.OutboxStream)
	if err != nil {
		return nil, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return nil, err
	}
	for read := uint64(0); read < info.State.Msgs; {
		b, err := cons.Fetch(500, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return nil, err
		}
		for m := range b.Messages() {
			out[m.Headers().Get(demo.ExecutionIDHeader)]++
			read++
		}
		if b.Error() != nil {
			return nil, b.Error()
		}
	}
	return out, nil
}

func TestPoolProcesses_EmailsWaitForTheCommsPoolWhileEverythingElseCompletes(t *testing.T) {
	t.Parallel()
	port := freePort(t)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	startDaemon(t, serverReady, nil, "server", "--store", t.TempDir(), "--listen", fmt.Sprintf("127.0.0.1:%d", port))
	env := []string{"CAPSTAN_NATS_URL=" + url}
	comms := startDaemon(t, "worker started", env, "worker", "--pool", "comms", "--capabilities", "email.send", "--id", "comms-1")
	startDaemon(t, "worker started", env, "worker", "--capabilities", "demo.echo,demo.flaky,demo.sleep,orders.refund", "--id", "default-1")

	// A worker of the default pool may not take email.send from comms.
	if _, stderr, code := capstanNoWait(t, env, "worker", "--capabilities", "email.send"); code == exitOK ||
		!strings.Contains(stderr, "existing resource conflicts") {
		t.Fatalf("a default-pool email.send worker: exit %d, stderr %s", code, stderr)
	}

	if code := comms.stop(t); code != exitOK {
		t.Fatalf("comms worker exited %d", code)
	}
	var emails []string
	for i := range 5 {
		stdout, stderr, code := capstan(t, url, "submit", "email.send", "--input", fmt.Sprintf(`{"to":"u%d@example.com","subject":"waits"}`, i))
		if code != exitOK {
			t.Fatalf("submit: exit %d, stderr %s", code, stderr)
		}
		emails = append(emails, strings.TrimSpace(stdout))
	}
	for _, call := range [][]string{
		{"call", "demo.echo", "--input", `{"hello":"pools"}`},
		{"call", "orders.refund", "--input", `{"orderId":"o-1","amount":20}`},
		{"call", "demo.flaky", "--input", `{"failTimes":1}`},
		{"call", "demo.sleep", "--input", `{"ms":10}`},
	} {
		stdout, stderr, code := capstan(t, url, append(call, "-o", "json")...)
		if code != exitOK || decode[printedEnvelope](t, stdout).Status != "completed" {
			t.Fatalf("%v with the comms pool down: exit %d, stdout %s, stderr %s", call, code, stdout, stderr)
		}
	}
	// Each email's await waits its second with the others.
	var waits sync.WaitGroup
	for _, id := range emails {
		waits.Go(func() {
			if _, stderr, code := capstan(t, url, "await", "-o", "json", id, "--wait", "1s"); code != exitNoEnvelope {
				t.Errorf("email %s with its pool down: exit %d, stderr %s", id, code, stderr)
			}
		})
	}
	waits.Wait()
	if t.Failed() {
		t.FailNow()
	}
	for _, id := range emails {
		// Not claimed: status tells it is queued, nothing more.
		if stdout, stderr, code := capstan(t, url, "status", id); code != exitOK || !strings.Contains(stdout, "queued") {
			t.Fatalf("email %s was touched with its pool down: exit %d, stdout %s, stderr %s", id, code, stdout, stderr)
		}
	}

	startDaemon(t, "worker started", env, "worker", "--pool", "comms", "--capabilities", "email.send", "--id", "comms-2")
	js, err := jetstream.New(connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range emails {
		stdout, stderr, code := capstan(t, url, "await", "-o", "json", id, "--wait", "60s")
		if code != exitOK {
			t.Fatalf("email %s after its pool came back: exit %d, stderr %s", id, code, stderr)
		}
		if e := decode[printedEnvelope](t, stdout); e.Status != "completed" || e.FinalizedBy != "comms-2" {
			t.Fatalf("email %s: %s", id, stdout)
		}
		if k := outboxMessages(t, url, id); k != 1 {
			t.Fatalf("email %s sent %d times", id, k)
		}
		if k := handlerCalls(t, js, id); k != 1 {
			t.Fatalf("email %s: its handler ran %d times", id, k)
		}
	}
}

// capstanNoWait runs a command that should end by itself and returns its
// output and exit code.
func capstanNoWait(t *testing.T, env []string, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr output
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	_ = cmd.Run()
	checkRaces(t, "capstan "+strings.Join(args, " "), stderr.String())
	if ctx.Err() != nil {
		t.Fatalf("capstan %s did not end", strings.Join(args, " "))
	}
	return stdout.String(), stderr.String(), cmd.ProcessState.ExitCode()
}

// diagnose logs what a stalled run left behind: the pool's consumer, the
// calls' errors, and the workers' goroutines.
func diagnose(t *testing.T, js jetstream.JetStream, urls string, workers []*daemon, ids []string, errs []error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if s, err := js.Stream(ctx, "CAPSTAN_EXEC"); err == nil {
		if c, err := s.Consumer(ctx, "pool-default"); err == nil {
			info, _ := c.Info(ctx)
			t.Logf("pool-default: %+v", info)
		}
		t.Logf("exec stream: %+v", s.CachedInfo().State)
	}
	failed := 0
	recs, _ := js.KeyValue(ctx, "CAPSTAN_EXECUTIONS")
	envs, _ := js.KeyValue(ctx, "CAPSTAN_ENVELOPES")
	for i, err := range errs {
		if err != nil {
			if failed < 5 {
				t.Logf("call %s error: %v", ids[i], err)
				if e, err := recs.Get(ctx, ids[i]); err == nil {
					var r execution.Record
					_ = envelope.Unmarshal(e.Value(), &r)
					t.Logf("  record rev %d: %+v", e.Revision(), r)
				} else {
					t.Logf("  record: %v", err)
				}
				for _, u := range strings.Split(urls, ",") {
					one, err := nats.Connect(u)
					if err != nil {
						continue
					}
					ojs, _ := jetstream.New(one)
					okv, err := ojs.KeyValue(ctx, "CAPSTAN_ENVELOPES")
					if err == nil {
						_, err = okv.Get(ctx, ids[i])
					}
					t.Logf("  envelope read on %s (%s): %v", u, one.ConnectedServerName(), err)
					one.Close()
				}
				if e, err := envs.Get(ctx, ids[i]); err == nil {
					var r envelope.Envelope
					_ = envelope.Unmarshal(e.Value(), &r)
					t.Logf("  envelope rev %d: %+v", e.Revision(), r)
				} else {
					t.Logf("  envelope: %v", err)
				}
			}
			failed++
		}
	}
	t.Logf("%d calls failed", failed)
	for _, w := range workers {
		_ = w.cmd.Process.Signal(syscall.SIGQUIT)
		select {
		case <-w.exited:
		case <-time.After(5 * time.Second):
		}
	}
}
