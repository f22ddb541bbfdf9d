package executor_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/demo"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// clusterRunSize is how many executions the failover test runs: 2,000, or
// CAPSTAN_CLUSTER_EXECUTIONS for a longer soak.
func clusterRunSize(t *testing.T) int {
	if s := os.Getenv("CAPSTAN_CLUSTER_EXECUTIONS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 100 {
			t.Fatalf("CAPSTAN_CLUSTER_EXECUTIONS=%q: want a number of at least 100", s)
		}
		return n
	}
	return 2000
}

// TestClusterR3_NodeLostTwiceMidRun_OneEnvelopeAndAtMostOneEmailPerExecution
// runs email.send (external, never retried) on a 3-node cluster with R3
// resources while a node is stopped and restarted twice: each time the node
// leading a bucket the executions depend on. Every execution ends with
// exactly one envelope, no email is sent twice, nothing is lost; email.send's
// receipts and reconciler (the demo's) recover what the losses leave, and a
// second attempt runs only after a proof of absence.
func TestClusterR3_NodeLostTwiceMidRun_OneEnvelopeAndAtMostOneEmailPerExecution(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("cluster failover run")
	}
	n := clusterRunSize(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	c := testenv.StartCluster(t, 3)

	setup := c.Connect(t)
	b, err := broker.Provision(ctx, setup, broker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if b.Replicas != 3 {
		t.Fatalf("auto provisioning on a 3-node cluster chose %d replicas, want 3", b.Replicas)
	}
	if _, err := demo.Provision(ctx, setup, b.Replicas); err != nil {
		t.Fatal(err)
	}

	var workers []*executor.Worker
	for i := range 2 {
		nc := c.Connect(t)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		workers = append(workers, startWorker(t, nc, executor.WorkerConfig{
			ID: fmt.Sprintf("worker-%d", i), Concurrency: 64, Lease: 10 * time.Second,
		}, demo.Catalog(js)...))
	}
	client := newClient(t, c.Connect(t))

	ids := make([]string, n)
	for i := range ids {
		ids[i] = envelope.NewExecutionID()
	}
	envs := make([]*envelope.Envelope, n)
	errs := make([]error, n)
	var done atomic.Int64

	// Eight producers, each a sequence of 50-call fan-outs, so that requests
	// are submitted throughout the run, failovers included.
	const producers, batch = 8, 50
	var wg sync.WaitGroup
	next := make(chan int)
	go func() {
		defer close(next)
		for start := 0; start < n; start += batch {
			next <- start
		}
	}()
	for range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for start := range next {
				end := min(start+batch, n)
				reqs := make([]executor.Request, 0, end-start)
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

	// Two losses, each of the node leading the bucket named, at 20% and 60%
	// of the run; each node comes back at 40% and 80%.
	chaosDone := make(chan struct{})
	go func() {
		defer close(chaosDone)
		for _, loss := range []struct {
			bucket            string
			stopAt, restartAt int
		}{
			{"KV_" + b.Names.ExecutionsBucket(), n / 5, 2 * n / 5},
			{"KV_" + b.Names.EnvelopesBucket(), 3 * n / 5, 4 * n / 5},
		} {
			if !waitProgress(ctx, &done, loss.stopAt) {
				return
			}
			node := leaderOf(ctx, t, c, loss.bucket)
			t.Logf("%d/%d done: stopping %s, leader of %s", done.Load(), n, c.Nodes[node].Server.Name(), loss.bucket)
			c.StopNode(node)
			if !waitProgress(ctx, &done, loss.restartAt) {
				c.RestartNode(t, node)
				return
			}
			t.Logf("%d/%d done: restarting %s", done.Load(), n, c.Nodes[node].Server.Name())
			c.RestartNode(t, node)
		}
	}()
	wg.Wait()
	<-chaosDone
	if ctx.Err() != nil {
		t.Fatalf("the run did not finish: %d of %d calls returned", done.Load(), n)
	}

	// Every call returned its envelope.
	statuses := map[string]int{}
	completed := map[string]bool{}
	for i, id := range ids {
		if errs[i] != nil {
			t.Fatalf("call %d (%s): %v", i, id, errs[i])
		}
		if envs[i] == nil || envs[i].ExecutionID != id {
			t.Fatalf("call %d (%s): envelope %+v", i, id, envs[i])
		}
		key := string(envs[i].Status)
		if envs[i].Error != nil {
			key += "/" + string(envs[i].Error.Code)
		}
		statuses[key]++
		if envs[i].Status == envelope.StatusCompleted {
			completed[id] = true
		}
	}
	t.Logf("envelopes by outcome: %v", statuses)

	// Exactly one envelope each: the bucket holds one per id, and its stream
	// stored no refused second finalization.
	readCtx, cancelRead := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancelRead()
	js, err := jetstream.New(c.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	envStream, err := js.Stream(readCtx, "KV_"+b.Names.EnvelopesBucket())
	if err != nil {
		t.Fatal(err)
	}
	info, err := envStream.Info(readCtx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != uint64(n) || info.State.LastSeq != uint64(n) {
		t.Fatalf("envelope stream holds %d messages up to sequence %d, want exactly %d", info.State.Msgs, info.State.LastSeq, n)
	}

	// At most one email per execution, and exactly one for each completed.
	// email.send reconciles against the outbox and may run a second attempt
	// only after its reconciler proved the first's email absent: no handler
	// call of an attempt after the one whose email the outbox holds (that
	// call would have been a second send, had the outbox not folded it into
	// the first), and no more calls than the envelope counts attempts.
	sent, sentBy := outboxByExecution(t, readCtx, js)
	for id, k := range sent {
		if k > 1 {
			t.Errorf("execution %s sent %d emails", id, k)
		}
	}
	ran, ranBy := handlerCallsByExecution(t, readCtx, js)
	attempts := map[string]int{}
	recovered := map[string]int{}
	for i, id := range ids {
		attempts[id] = envs[i].Attempts
		if r := envs[i].Recovered; r != nil {
			recovered[r.How]++
		}
	}
	for id, k := range ran {
		if k > attempts[id] {
			t.Errorf("execution %s ran its handler %d times in %d attempts", id, k, attempts[id])
		}
		if sent[id] > k {
			t.Errorf("execution %s sent %d emails in %d recorded handler calls", id, sent[id], k)
		}
		for _, a := range ranBy[id] {
			if sentBy[id] > 0 && a > sentBy[id] {
				t.Errorf("execution %s: attempt %d ran after attempt %d sent its email", id, a, sentBy[id])
			}
		}
	}
	for id := range completed {
		if sent[id] != 1 {
			t.Errorf("completed execution %s sent %d emails in %d handler calls, want 1", id, sent[id], ran[id])
		}
	}
	var calls, conflicts, takeovers, recoveries uint64
	for _, w := range workers {
		s := w.Stats()
		calls += s.HandlerCalls
		conflicts += s.Conflicts
		takeovers += s.TakenOver
		recoveries += s.Recovered
	}
	t.Logf("handler calls %d, emails %d, envelope conflicts %d, takeovers %d, recovered %v (workers count %d)", calls, len(sent),
		conflicts, takeovers, recovered, recoveries)
	if want := uint64(n + sentAgainAfterProof(attempts)); calls > want {
		t.Errorf("%d handler calls for %d executions of a capability that is never retried (%d attempts counted)", calls, n, want)
	}
}

// sentAgainAfterProof counts the attempts after the first that envelopes
// count: each one ran only after a reconciler proved the attempt before it
// absent.
func sentAgainAfterProof(attempts map[string]int) int {
	k := 0
	for _, a := range attempts {
		k += max(a-1, 0)
	}
	return k
}

// waitProgress waits until done reaches at, or ctx ends.
func waitProgress(ctx context.Context, done *atomic.Int64, at int) bool {
	for done.Load() < int64(at) {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(50 * time.Millisecond):
		}
	}
	return true
}

// leaderOf returns the index of the node leading the stream.
func leaderOf(ctx context.Context, t *testing.T, c *testenv.Cluster, stream string) int {
	for {
		for i, node := range c.Nodes {
			if node.Server == nil || !node.Server.Running() {
				continue
			}
			nc, err := nats.Connect(node.URL)
			if err != nil {
				continue
			}
			js, _ := jetstream.New(nc)
			reqCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
			s, err := js.Stream(reqCtx, stream)
			cancel()
			nc.Close()
			if err != nil || s.CachedInfo().Cluster == nil {
				continue
			}
			leader := s.CachedInfo().Cluster.Leader
			for j, other := range c.Nodes {
				if other.Server != nil && other.Server.Name() == leader {
					return j
				}
			}
			_ = i
		}
		select {
		case <-ctx.Done():
			t.Errorf("stream %s has no leader", stream)
			return 0
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// outboxByExecution counts the outbox's messages per execution id, and
// returns the attempt that sent each execution's last one. Right after a
// node's restart a stream may be without a leader for a moment: the whole
// read is tried again until ctx ends.
func outboxByExecution(t *testing.T, ctx context.Context, js jetstream.JetStream) (count, attempt map[string]int) {
	t.Helper()
	type outbox struct{ count, attempt map[string]int }
	o := eventually(t, ctx, "read the outbox", func() (outbox, error) {
		out := outbox{map[string]int{}, map[string]int{}}
		s, err := js.Stream(ctx, demo.OutboxStream)
		if err != nil {
			return out, err
		}
		info, err := s.Info(ctx)
		if err != nil {
			return out, err
		}
		if info.State.Msgs == 0 {
			return out, nil
		}
		cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
		if err != nil {
			return out, err
		}
		for read := uint64(0); read < info.State.Msgs; {
			batch, err := cons.Fetch(500, jetstream.FetchMaxWait(5*time.Second))
			if err != nil {
				return out, err
			}
			for m := range batch.Messages() {
				id := m.Headers().Get(demo.ExecutionIDHeader)
				out.count[id]++
				out.attempt[id], _ = strconv.Atoi(m.Headers().Get(demo.AttemptHeader))
				read++
			}
			if batch.Error() != nil {
				return out, batch.Error()
			}
		}
		return out, nil
	})
	return o.count, o.attempt
}

// handlerCallsByExecution counts the demo handlers' calls per execution id,
// from the calls stream the demo appends to before every effect, and lists
// the attempts they were made for.
func handlerCallsByExecution(t *testing.T, ctx context.Context, js jetstream.JetStream) (map[string]int, map[string][]int) {
	t.Helper()
	calls := eventually(t, ctx, "read the calls stream", func() ([]demo.HandlerCall, error) { return demo.ReadCalls(ctx, js) })
	out, by := map[string]int{}, map[string][]int{}
	for _, c := range calls {
		out[c.ExecutionID]++
		by[c.ExecutionID] = append(by[c.ExecutionID], c.Attempt)
	}
	return out, by
}

// eventually calls read until it succeeds, failing the test when ctx ends
// first.
func eventually[T any](t *testing.T, ctx context.Context, what string, read func() (T, error)) T {
	t.Helper()
	for {
		v, err := read()
		if err == nil {
			return v
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: %v", what, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// BenchmarkDeployments measures one workload on the deployments a user
// chooses between: 5,000 demo.echo calls by 64 concurrent callers, served by
// two workers of 64, on a single server and on a 3-node cluster (R3), each
// with JetStream's default lazy flush and with --sync always. Run with
// -benchtime 1x: each iteration is the whole workload.
//
//	go test -run '^$' -bench Deployments -benchtime 1x ./executor
func BenchmarkDeployments(b *testing.B) {
	for _, d := range []struct {
		name    string
		cluster bool
		sync    bool
	}{
		{"single", false, false},
		{"single-sync-always", false, true},
		{"cluster3", true, false},
		{"cluster3-sync-always", true, true},
	} {
		b.Run(d.name, func(b *testing.B) {
			var opts []testenv.Option
			if d.sync {
				opts = append(opts, testenv.SyncAlways())
			}
			var connect func() *nats.Conn
			if d.cluster {
				c := testenv.StartCluster(b, 3, opts...)
				connect = func() *nats.Conn { return c.Connect(b) }
			} else {
				env := testenv.Start(b, opts...)
				connect = func() *nats.Conn { return env.Connect(b) }
			}
			benchDeployment(b, connect, d.cluster)
		})
	}
}

func benchDeployment(b *testing.B, connect func() *nats.Conn, cluster bool) {
	const calls, callers = 5000, 64
	ctx := context.Background()
	pb, err := broker.Provision(ctx, connect(), broker.Config{})
	if err != nil {
		b.Fatal(err)
	}
	if want := map[bool]int{false: 1, true: 3}[cluster]; pb.Replicas != want {
		b.Fatalf("replicas %d, want %d", pb.Replicas, want)
	}
	for i := range 2 {
		nc := connect()
		reg, err := executor.NewRegistry(echoCap(nil))
		if err != nil {
			b.Fatal(err)
		}
		w, err := executor.NewWorker(nc, reg, executor.WorkerConfig{ID: fmt.Sprintf("bench-%d", i), Concurrency: 64})
		if err != nil {
			b.Fatal(err)
		}
		wctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- w.Run(wctx) }()
		b.Cleanup(func() { cancel(); <-done })
	}
	// The calls wait for a worker through the node losses: a pool whose
	// liveness entry lapsed while its bucket had no leader is not down.
	client, err := executor.NewClient(connect(), executor.ClientConfig{Actor: alice, Unserved: executor.UnservedWait})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = client.Close() })
	// Warm up: the workers serve, the client's catalog lists demo.echo.
	warm, cancelWarm := context.WithTimeout(ctx, time.Minute)
	defer cancelWarm()
	for {
		e, err := client.Call(warm, "demo.echo", echoIn{Hello: "warm"})
		if err == nil && e.Status == envelope.StatusCompleted {
			break
		}
		if warm.Err() != nil {
			b.Fatalf("warm-up call: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}

	var all []time.Duration
	var elapsed time.Duration
	b.ResetTimer()
	for range b.N {
		lat := make([]time.Duration, calls)
		next := make(chan int, calls)
		for i := range calls {
			next <- i
		}
		close(next)
		start := time.Now()
		var wg sync.WaitGroup
		for range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range next {
					t0 := time.Now()
					e, err := client.Call(ctx, "demo.echo", echoIn{Hello: strconv.Itoa(i)})
					if err != nil || e.Status != envelope.StatusCompleted {
						b.Errorf("call %d: %+v, %v", i, e, err)
						return
					}
					lat[i] = time.Since(t0)
				}
			}()
		}
		wg.Wait()
		elapsed += time.Since(start)
		all = append(all, lat...)
	}
	b.StopTimer()
	slices.Sort(all)
	pct := func(p float64) float64 { return float64(all[int(p*float64(len(all)-1))]) / float64(time.Millisecond) }
	b.ReportMetric(float64(len(all))/elapsed.Seconds(), "calls/s")
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
	b.ReportMetric(0, "ns/op")
}
