package executor_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/capstan-dev/capstan/internal/testhooks"
)

type greeting struct {
	Name string `json:"name"`
}

func helloCap() executor.Capability {
	return executor.Define("greet.hello", executor.Meta{
		Description: "Greets someone by name.",
		Expose:      executor.On(executor.SurfaceDirect),
		SideEffect:  executor.SideEffectNone,
	}, func(ctx context.Context, call executor.Call[greeting]) (string, error) {
		return "Hello, " + call.Input.Name + "!", nil
	})
}

// A capability nobody serves still ends CAPABILITY_NOT_FOUND at its first
// delivery, also from a worker whose copy of the catalog lags the bucket
// (TestCatalog_WorkersCopyLagsTheBucket_RequestWaitsForTheNewerWorker shows a
// served one left for its worker): the read of the bucket finds nothing, and
// the request is not left for later (an agent calling a tool that does not exist hears so at
// once).
func TestRollout_UnknownCapabilityEndsAtItsFirstDelivery(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		knobs testhooks.WorkerKnobs
	}{
		{"a worker whose catalog is current", testhooks.WorkerKnobs{}},
		{"a worker whose copy lags the catalog", testhooks.WorkerKnobs{CatalogLag: time.Hour}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			env := testenv.Start(t)
			s := newStore(t, env)
			w := startWorker(t, env.Connect(t), testhooks.Worker(executor.WorkerConfig{SweepInterval: -1}, tc.knobs), echoCap(nil))
			// As a producer's client sends it: its catalog does not list it.
			req := &envelope.Request{ExecutionID: envelope.NewExecutionID(), CapabilityID: "nope.missing"}
			s.publishRequest(s.b.Names.UnroutedSubject(broker.Anonymous), req)
			got := s.await(req.ExecutionID)
			if got.Status != envelope.StatusFailed || got.Error == nil || got.Error.Code != envelope.CodeCapabilityNotFound {
				t.Fatalf("envelope %s %+v, want CAPABILITY_NOT_FOUND", got.Status, got.Error)
			}
			s.settled(req.ExecutionID)
			if n := w.Stats().Handled; n != 1 {
				t.Fatalf("delivered %d times; want once, ended at its first delivery", n)
			}
		})
	}
}

// The first minutes of a user: a worker of the deployment is already
// serving (capstan dev's demo worker), a program starts a worker of its own
// pool and calls it as soon as Ready is closed, from a client opened before
// the worker started (whose copy of the catalog may still be catching up, so
// that its calls go through _unrouted, where the older worker may take them)
// and from one opened after. Every call completes at its first attempt.
func TestReady_CallsAtOnceComplete(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	old := startWorker(t, env.Connect(t), executor.WorkerConfig{SweepInterval: -1}, echoCap(nil))
	early := newClient(t, env.Connect(t))

	reg, err := executor.NewRegistry(helloCap())
	if err != nil {
		t.Fatal(err)
	}
	w, err := executor.NewWorker(env.Connect(t), reg, executor.WorkerConfig{Pool: "greeters", SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("worker: %v", err)
		}
	})
	select {
	case <-w.Ready():
	case err := <-done:
		t.Fatalf("the worker stopped before it was ready: %v", err)
	}

	late := newClient(t, env.Connect(t))
	const calls = 16
	callCtx := ctxT(t)
	var wg sync.WaitGroup
	envs := make([]*envelope.Envelope, 2*calls)
	errs := make([]error, 2*calls)
	for i := range 2 * calls {
		c := early
		if i%2 == 1 {
			c = late
		}
		wg.Go(func() {
			envs[i], errs[i] = c.Call(callCtx, "greet.hello", greeting{Name: "Ada"}, executor.As(alice))
		})
	}
	wg.Wait()
	for i, got := range envs {
		if errs[i] != nil {
			t.Fatalf("call %d: %v", i, errs[i])
		}
		if got.Status != envelope.StatusCompleted || got.Attempts != 1 {
			t.Fatalf("call %d: envelope %s after %d attempts, error %+v", i, got.Status, got.Attempts, got.Error)
		}
	}
	if st := old.Stats(); st.Finalized != 0 {
		t.Fatalf("the older worker finalized %d of the calls", st.Finalized)
	}
}

// Ready is closed only when the worker serves: a worker whose Run fails
// before (here: no server answers, and StartupWait is spent) never closes it.
func TestReady_NeverClosedWhenRunFails(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	nc := env.Connect(t)
	reg, err := executor.NewRegistry(echoCap(nil))
	if err != nil {
		t.Fatal(err)
	}
	w, err := executor.NewWorker(nc, reg, executor.WorkerConfig{StartupWait: 1})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.Ready():
		t.Fatal("Ready closed before Run")
	default:
	}
	nc.Close()
	if err := w.Run(ctxT(t)); err == nil {
		t.Fatal("Run on a closed connection returned nil")
	}
	select {
	case <-w.Ready():
		t.Fatal("Ready closed although Run failed")
	default:
	}
}
