package executor_test

import (
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/internal/testhooks"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
)

func TestCall_EchoCompletesWithOneEnvelope(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	nc := env.Connect(t)
	var calls atomic.Int64
	startWorker(t, nc, executor.WorkerConfig{}, echoCap(&calls))
	c := newClient(t, env.Connect(t))

	got, err := c.Call(ctxT(t), "demo.echo", map[string]any{"hello": "world"})
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != envelope.StatusCompleted {
		t.Fatalf("status %s, error %+v", got.Status, got.Error)
	}
	var out echoIn
	if err := got.Output.Decode(&out); err != nil || out.Hello != "world" {
		t.Fatalf("output %+v, err %v", out, err)
	}
	if got.Attempts != 1 || calls.Load() != 1 {
		t.Fatalf("attempts %d, calls %d", got.Attempts, calls.Load())
	}
}

func TestSubmitTwiceSameID_RunsOnceAndBothAwaitsGetTheSameEnvelope(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	var calls atomic.Int64
	w := startWorker(t, env.Connect(t), executor.WorkerConfig{}, echoCap(&calls))
	c := newClient(t, env.Connect(t))
	ctx := ctxT(t)

	id := envelope.NewExecutionID()
	for i := 0; i < 2; i++ {
		got, err := c.Submit(ctx, "demo.echo", map[string]any{"hello": "once"}, executor.WithID(id))
		if err != nil || got != id {
			t.Fatalf("submit %d: id %q err %v", i, got, err)
		}
	}
	a, err := c.Await(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	b, err := newClient(t, env.Connect(t)).Await(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if a.Status != envelope.StatusCompleted || a.FinalizedBy != b.FinalizedBy || !a.FinalizedAt.Equal(b.FinalizedAt) {
		t.Fatalf("awaits differ: %+v vs %+v", a, b)
	}
	// A third submit after completion is deduplicated by the stream; a copy
	// of the request under another message id, which the stream's dedup
	// window does not know, reaches the worker, which finds the envelope.
	if _, err := c.Submit(ctx, "demo.echo", map[string]any{"hello": "once"}, executor.WithID(id)); err != nil {
		t.Fatal(err)
	}
	b2 := testhooks.Broker(c)
	req, err := envelope.Marshal(&envelope.Request{V: envelope.Version, ExecutionID: id, CapabilityID: "demo.echo",
		Input: envelope.MustRaw(map[string]any{"hello": "once"}), Actor: alice, Surface: string(executor.SurfaceDirect),
		SubmittedAt: time.Now().UTC()})
	if err != nil {
		t.Fatal(err)
	}
	m := nats.NewMsg(b2.Names.ExecSubject(broker.Anonymous, "demo.echo"))
	m.Data = req
	if _, err := b2.JS.PublishMsg(ctx, m, jetstream.WithMsgID(broker.Key(broker.Anonymous, id)+".copy")); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the worker acknowledges the copy", func() bool {
		info, err := b2.Exec.Info(ctx)
		return err == nil && info.State.Msgs == 0
	})
	if n, d := calls.Load(), w.Stats().Duplicates; n != 1 || d != 1 {
		t.Fatalf("handler called %d times, %d duplicate deliveries; want 1 and 1", n, d)
	}
}

func TestCallMany_FanOutOfFiveThousandWithoutAConsumerPerCall(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	var calls atomic.Int64
	startWorker(t, env.Connect(t), executor.WorkerConfig{Concurrency: 128}, echoCap(&calls))
	c := newClient(t, env.Connect(t))
	ctx := ctxT(t)

	consumers := func() int {
		n := 0
		// The streams an await could put a consumer on. (The catalog watcher's
		// one ordered consumer may be recreated under load; it is per client.)
		for _, s := range []string{"CAPSTAN_EXEC", "KV_CAPSTAN_ENVELOPES", "KV_CAPSTAN_EXECUTIONS"} {
			st, err := testhooks.Broker(c).JS.Stream(ctx, s)
			if err != nil {
				continue
			}
			n += st.CachedInfo().State.Consumers
		}
		return n
	}
	before := consumers()

	const n = 5000
	reqs := make([]executor.Request, n)
	for i := range reqs {
		reqs[i] = executor.Request{CapabilityID: "demo.echo", Input: echoIn{Hello: strconv.Itoa(i)}}
	}
	envs, errs := c.CallMany(ctx, reqs)
	seen := map[string]bool{}
	for i := range reqs {
		if errs[i] != nil {
			t.Fatalf("call %d: %v", i, errs[i])
		}
		if envs[i].Status != envelope.StatusCompleted {
			t.Fatalf("call %d: %s %+v", i, envs[i].Status, envs[i].Error)
		}
		var out echoIn
		if err := envs[i].Output.Decode(&out); err != nil || out.Hello != strconv.Itoa(i) {
			t.Fatalf("call %d: output %+v, err %v", i, out, err)
		}
		seen[envs[i].ExecutionID] = true
	}
	if len(seen) != n {
		t.Fatalf("%d distinct executions, want %d", len(seen), n)
	}
	if after := consumers(); after != before {
		t.Fatalf("consumers went from %d to %d during the fan-out", before, after)
	}
	keys, err := testhooks.Broker(c).Envelopes.ListKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	count := 0
	for range keys.Keys() {
		count++
	}
	if count != n {
		t.Fatalf("%d envelopes, want %d", count, n)
	}
	if calls.Load() != n {
		t.Fatalf("handler called %d times, want %d", calls.Load(), n)
	}
}
