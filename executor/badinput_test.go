package executor_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/execution"
	"github.com/capstan-dev/capstan/internal/testhooks"

	"github.com/nats-io/nats.go"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// waitEmpty waits until the exec stream holds no message: every request was
// settled (acknowledged or terminated), none is left to redeliver.
func waitEmpty(t *testing.T, c *executor.Client) {
	t.Helper()
	ctx := ctxT(t)
	st, err := testhooks.Broker(c).JS.Stream(ctx, "CAPSTAN_EXEC")
	if err != nil {
		t.Fatal(err)
	}
	for {
		info, err := st.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Msgs == 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("exec stream still holds %d messages", info.State.Msgs)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func TestUndecodableRequest_TerminatedAndFinalizedInputInvalid(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	nc := env.Connect(t)
	startWorker(t, nc, executor.WorkerConfig{}, echoCap(nil))
	c := newClient(t, env.Connect(t))
	ctx := ctxT(t)

	withID := envelope.NewExecutionID()
	for _, m := range []*nats.Msg{
		{Subject: "capstan.exec._anon.demo.echo", Data: []byte("\xc1 not msgpack"), Header: nats.Header{"Nats-Msg-Id": []string{withID}}},
		{Subject: "capstan.exec._anon.demo.echo", Data: []byte{0x93, 0x01}},                                         // truncated array, no id
		{Subject: "capstan.exec._anon.demo.echo", Data: mustMarshal(t, map[string]any{"v": 9, "executionId": "x"})}, // wrong version
		{Subject: "capstan.exec._anon._unrouted", Data: []byte("{}"), Header: nats.Header{"Nats-Msg-Id": []string{"bad id!"}}},
	} {
		if _, err := testhooks.Broker(c).JS.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	got, err := c.Await(ctx, withID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != envelope.StatusFailed || got.Error == nil || got.Error.Code != envelope.CodeInputInvalid {
		t.Fatalf("got %s %+v, want failed INPUT_INVALID", got.Status, got.Error)
	}
	waitEmpty(t, c)
	// The worker is still serving.
	ok, err := c.Call(ctx, "demo.echo", map[string]any{"hello": "still here"})
	if err != nil || ok.Status != envelope.StatusCompleted {
		t.Fatalf("after bad input: %v %+v", err, ok)
	}
}

func mustMarshal(t *testing.T, v any) []byte {
	b, err := envelope.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestUnknownCapability_EndsCapabilityNotFound(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	startWorker(t, env.Connect(t), executor.WorkerConfig{}, echoCap(nil))
	c := newClient(t, env.Connect(t))

	got, err := c.Call(ctxT(t), "nope.nothing", map[string]any{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != envelope.StatusFailed || got.Error == nil || got.Error.Code != envelope.CodeCapabilityNotFound {
		t.Fatalf("got %s %+v", got.Status, got.Error)
	}
	if got.FinalizedBy == "" {
		t.Fatal("envelope was not finalized by a worker")
	}
	waitEmpty(t, c)
}

func TestInvalidCapabilityID_RefusedBeforeItReachesASubject(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	c := newClient(t, env.Connect(t))
	ctx := ctxT(t)

	// Watch every exec subject: nothing may be published.
	sub, err := env.Connect(t).SubscribeSync("capstan.exec.>")
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"orders.*", "a..b", ">", "orders.>", "a b", "_unrouted", "", "Orders.refund"} {
		got, err := c.Call(ctx, id, map[string]any{})
		if err != nil {
			t.Fatalf("%q: %v", id, err)
		}
		if got.Status != envelope.StatusFailed || got.Error == nil || got.Error.Code != envelope.CodeCapabilityNotFound {
			t.Fatalf("%q: got %s %+v", id, got.Status, got.Error)
		}
		_, err = c.Submit(ctx, id, nil)
		var ce *envelope.CapabilityError
		if !errors.As(err, &ce) || ce.Code != envelope.CodeCapabilityNotFound || !errors.Is(err, executor.ErrInvalidCapability) {
			t.Fatalf("%q: submit err %v", id, err)
		}
	}
	if err := testhooks.Broker(c).NC.Flush(); err != nil {
		t.Fatal(err)
	}
	if m, err := sub.NextMsg(200 * time.Millisecond); !errors.Is(err, nats.ErrTimeout) {
		t.Fatalf("a request reached %v", m.Subject)
	}
}

func TestStaleProducerCatalog_UnroutedRequestIsForwarded(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	c := newClient(t, env.Connect(t))
	ctx := ctxT(t)
	// The client's catalog is empty: the request goes to _unrouted and waits
	// there for a worker.
	id, err := c.Submit(ctx, "demo.echo", map[string]any{"hello": "late"})
	if err != nil {
		t.Fatal(err)
	}
	startWorker(t, env.Connect(t), executor.WorkerConfig{}, echoCap(nil))
	got, err := c.Await(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != envelope.StatusCompleted {
		t.Fatalf("got %s %+v", got.Status, got.Error)
	}
	waitEmpty(t, c)
}

func TestGracefulShutdown_DrainsInFlightWork(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	started := make(chan struct{}, 1)
	release := make(chan struct{})
	slow := executor.Define("demo.slow", executor.Meta{Description: "Waits to be released.", SideEffect: executor.SideEffectWrite,
		Expose: executor.On(executor.SurfaceDirect)},
		func(ctx context.Context, c executor.Call[struct{}]) (string, error) {
			started <- struct{}{}
			<-release
			return "done", nil
		})
	reg, err := executor.NewRegistry(slow)
	if err != nil {
		t.Fatal(err)
	}
	w, err := executor.NewWorker(env.Connect(t), reg, executor.WorkerConfig{Grace: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	waitServing(t, env.Connect(t), "demo.slow")
	c := newClient(t, env.Connect(t))
	id, err := c.Submit(ctxT(t), "demo.slow", nil)
	if err != nil {
		t.Fatal(err)
	}
	<-started
	cancel() // shutdown begins while the handler runs
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	got, err := c.Await(ctxT(t), id)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != envelope.StatusCompleted || got.FinalizedBy != w.ID() {
		t.Fatalf("got %s by %s, want completed by the draining worker", got.Status, got.FinalizedBy)
	}
	if _, _, err := broker.Load[execution.Record](ctxT(t), testhooks.Broker(c).Executions, broker.Key(broker.Anonymous, id)); err != nil {
		t.Fatal(err)
	}
}
