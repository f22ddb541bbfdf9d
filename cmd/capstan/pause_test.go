package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/demo"
	"github.com/capstan-dev/capstan/internal/pauses"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// The emergency stop, with real processes: a flood of email.send on three
// worker processes; `capstan pause email.send` returns once every worker has
// confirmed it, and from then on (plus the second the design promises) no
// handler of email.send starts — counted with the calls stream, which holds
// one message per handler call — while the calls still queued stay queued.
// `capstan unpause` lets them run: every call ends completed, each handler
// called once, each email sent once.
func TestPauseProcesses_FloodOnThreeWorkers_HeldThenRunOnce(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("processes")
	}
	port := freePort(t)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	spawn(t, nil, "server", "--store", t.TempDir(), "--listen", fmt.Sprintf("127.0.0.1:%d", port)).waitOutput(t, serverReady)
	pauseFlood(t, url, nil)
}

// The same on a three-node cluster, with a node SIGKILLed while the pause
// holds: the workers connected to it move to the others, and still start
// nothing of what is paused.
func TestPauseProcesses_ClusterNodeKilledDuringThePause_HeldThenRunOnce(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("cluster of processes")
	}
	nodes, urls := startServerCluster(t)
	pauseFlood(t, urls, func(ctx context.Context, js jetstream.JetStream) {
		// Every replica current first, so that the two nodes left hold a
		// quorum of everything; then the node that leads the pauses
		// bucket goes.
		waitAllCurrent(t, ctx, js)
		leader := streamLeader(ctx, js, "KV_"+names.PausesBucket())
		for _, node := range nodes {
			if node.name == leader {
				t.Logf("SIGKILL %s, leader of the pauses bucket, while email.send is paused", node.name)
				node.d.kill(t)
				return
			}
		}
		t.Fatalf("no node leads the pauses bucket (%q)", leader)
	})
}

// pauseFlood is the run of both tests; duringPause, when set, is done once
// the pause holds.
func pauseFlood(t *testing.T, url string, duringPause func(context.Context, jetstream.JetStream)) {
	t.Helper()
	const n, workers = 400, 3
	env := []string{"CAPSTAN_NATS_URL=" + url}
	for i := range workers {
		spawn(t, env, "worker", "--id", fmt.Sprintf("pw-%d", i+1), "--concurrency", "8", "--lease", "10s").waitOutput(t, "worker started")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*guard)
	defer cancel()
	nc := connect(t, url)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	client, err := executor.NewClient(nc, executor.ClientConfig{Actor: envelope.Actor{Kind: "user", ID: "flood"}})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	ids := make([]string, n)
	for i := range ids {
		if ids[i], err = client.Submit(ctx, "email.send", demo.EmailInput{To: fmt.Sprintf("u%d@example.com", i), Subject: "flood", HoldMs: 1000}); err != nil {
			t.Fatal(err)
		}
	}
	// Pause in the middle of the flood: once the calls stream (one message
	// per handler call) holds a few.
	for {
		s, err := js.Stream(ctx, demo.CallsStream)
		if err == nil && s.CachedInfo().State.Msgs >= 30 {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the flood never started")
		}
		time.Sleep(20 * time.Millisecond)
	}
	out, stderr, code := capstan(t, url, "pause", "email.send", "--reason", "mail to the wrong list", "-o", "json")
	if code != 0 {
		t.Fatalf("capstan pause: exit %d\n%s%s", code, out, stderr)
	}
	answer := decode[pauseAnswer](t, out)
	applied := 0
	for _, w := range answer.Workers {
		if w.Applied {
			applied++
		}
	}
	if applied != workers {
		t.Fatalf("%d workers confirmed the pause, want %d: %+v", applied, workers, answer.Workers)
	}
	// The command returned once every worker applied the pause; the design
	// promises it within a second of the command. From then on: no handler
	// of email.send starts.
	time.Sleep(time.Second)
	atPause := readCalls(t, ctx, js)
	if len(atPause) >= n {
		t.Fatalf("all %d calls ran before the pause held; the flood is too short to test it", n)
	}
	started := map[string]bool{}
	for _, c := range atPause {
		started[c.ExecutionID] = true
	}
	// The attempts running when the pause came end as they would.
	for id := range started {
		env, err := client.Await(ctx, id)
		if err != nil || env.Status != envelope.StatusCompleted {
			t.Fatalf("call %s, started before the pause: %v %+v", id, err, env)
		}
	}
	if duringPause != nil {
		duringPause(ctx, js)
	}
	// Long enough for every held call to come back and be put back again
	// (the longest wait of a held delivery is 5 s and a quarter).
	time.Sleep(8 * time.Second)
	if during := readCalls(t, ctx, js); len(during) != len(atPause) {
		t.Fatalf("%d handler calls of email.send began while it was paused", len(during)-len(atPause))
	}
	queued := 0
	for _, id := range ids {
		if started[id] {
			continue
		}
		queued++
		st, err := client.Status(ctx, id)
		if err != nil {
			// What the workers say of it, and the client's connection, for
			// the reader of the failure.
			v, verr := client.Execution(ctx, executor.ExecutionRequest{ExecutionID: id})
			state := ""
			if v != nil {
				state = v.State
			}
			t.Fatalf("status of held call %s: %v (workers: %q, %v; connection %v)", id, err, state, verr, nc.Status())
		}
		if st.Envelope != nil {
			t.Fatalf("held call %s ended while paused: %+v", id, st.Envelope)
		}
	}
	t.Logf("%d calls ran before the pause held, %d held", len(atPause), queued)

	out, stderr, code = capstan(t, url, "unpause", "email.send", "--reason", "list fixed", "-o", "json")
	if code != 0 {
		t.Fatalf("capstan unpause: exit %d\n%s%s", code, out, stderr)
	}
	for i, id := range ids {
		env, err := client.Await(ctx, id)
		if err != nil || env.Status != envelope.StatusCompleted || env.Attempts != 1 {
			t.Fatalf("call %d (%s) after the pause: %v %+v", i, id, err, env)
		}
	}
	calls := readCalls(t, ctx, js)
	perExecution := map[string]int{}
	for _, c := range calls {
		perExecution[c.ExecutionID]++
	}
	for _, id := range ids {
		if perExecution[id] != 1 {
			t.Errorf("execution %s: %d handler calls, want 1", id, perExecution[id])
		}
	}
	if len(calls) != n {
		t.Errorf("%d handler calls for %d calls", len(calls), n)
	}
	for id, k := range outboxCounts(t, ctx, js) {
		if k != 1 {
			t.Errorf("execution %s sent %d emails", id, k)
		}
	}
}

// `capstan pauses` over a bucket that holds a record no worker honours
// (written by hand: here one that does not decode) lists the pauses in
// force all the same, and warns, naming the record, rather than fail whole
// in the middle of an incident.
func TestPauses_ListsWhatIsInForceAndNamesWhatWorkersIgnore(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	if _, err := broker.Provision(ctx, connect(t, env.URL), broker.Config{}); err != nil {
		t.Fatal(err)
	}
	if _, stderr, code := capstan(t, env.URL, "pause", "email.send", "--reason", "mail loop", "-o", "json"); code != exitOK {
		t.Fatalf("pause: exit %d: %s", code, stderr)
	}
	kv, err := env.JetStream(t).KeyValue(ctx, names.PausesBucket())
	if err != nil {
		t.Fatal(err)
	}
	garbled := pauses.Scope{Capability: "email.garbled"}.Key()
	if _, err := kv.Put(ctx, garbled, []byte(`{"v":1,"scope":`)); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, code := capstan(t, env.URL, "pauses", "-o", "json")
	list := decode[[]pauses.Pause](t, stdout)
	if code != exitOK || len(list) != 1 || list[0].Scope.Capability != "email.send" {
		t.Fatalf("exit %d, listed %+v: %s", code, list, stderr)
	}
	if !strings.Contains(stderr, "warning") || !strings.Contains(stderr, garbled) {
		t.Fatalf("the listing does not name the record every worker ignores: %s", stderr)
	}
}
