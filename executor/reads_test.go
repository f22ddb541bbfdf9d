package executor_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/capstan-dev/capstan/internal/testhooks"
)

// Reads without claims (DESIGN §14): a read declared Idempotent runs with
// no execution record; its envelope alone decides its end.

// gatedRead is a read declared Idempotent (so it runs without a claim)
// whose handler counts its calls, says it started on started, and waits
// for release or its context.
func gatedRead(id string, calls *atomic.Int64, started chan<- struct{}, release <-chan struct{}) executor.Capability {
	return executor.Define(id, executor.Meta{Description: "Reads, slowly.", Expose: executor.On(executor.SurfaceDirect),
		SideEffect: executor.SideEffectRead, Idempotent: true, Timeout: 10 * time.Minute},
		func(ctx context.Context, c executor.Call[echoIn]) (echoIn, error) {
			calls.Add(1)
			select {
			case started <- struct{}{}:
			default:
			}
			select {
			case <-release:
				return c.Input, nil
			case <-ctx.Done():
				return echoIn{}, ctx.Err()
			}
		})
}

// recordOf reads the execution's record straight from its bucket: nil when
// there is none.
func recordOf(t *testing.T, b *broker.Broker, id string) []byte {
	t.Helper()
	e, err := b.Executions.Get(ctxT(t), broker.Key(broker.Anonymous, id))
	if err != nil {
		return nil
	}
	return e.Value()
}

// A read runs and completes with no record written at any point; its trail
// is complete, and its one envelope holds. A write beside it keeps its
// record.
func TestReads_NoRecordWrittenOneEnvelope(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	nc := env.Connect(t)
	var calls atomic.Int64
	started, release := make(chan struct{}, 1), make(chan struct{})
	var writes atomic.Int64
	startWorker(t, nc, executor.WorkerConfig{}, gatedRead("t.read", &calls, started, release),
		executor.Define("t.write", executor.Meta{Description: "Writes.", Expose: executor.On(executor.SurfaceDirect),
			SideEffect: executor.SideEffectWrite, Idempotent: true},
			func(ctx context.Context, c executor.Call[echoIn]) (echoIn, error) { writes.Add(1); return c.Input, nil }))
	c := newClient(t, env.Connect(t))
	b := testhooks.Broker(c)
	id, err := c.Submit(ctxT(t), "t.read", echoIn{Hello: "r"}, executor.As(alice))
	if err != nil {
		t.Fatal(err)
	}
	<-started
	if rec := recordOf(t, b, id); rec != nil {
		t.Fatalf("a running read has a record: %s", rec)
	}
	s, err := c.Status(ctxT(t), id)
	if err == nil && (s.Record != nil || s.Envelope != nil) {
		t.Errorf("status of a running read: %+v", s)
	}
	close(release)
	got, err := c.Await(ctxT(t), id)
	if err != nil || got.Status != envelope.StatusCompleted || got.Attempts != 1 {
		t.Fatalf("envelope %+v %v", got, err)
	}
	if rec := recordOf(t, b, id); rec != nil {
		t.Errorf("a finished read has a record: %s", rec)
	}
	flushAudit(t)
	if got := typesOf(trail(t, c, id)); len(got) != 3 || got[0] != audit.EventRequested || got[1] != audit.EventStarted || got[2] != audit.EventCompleted {
		t.Errorf("trail %v", got)
	}
	wid, err := c.Submit(ctxT(t), "t.write", echoIn{Hello: "w"}, executor.As(alice))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := c.Await(ctxT(t), wid); err != nil || got.Status != envelope.StatusCompleted {
		t.Fatalf("write %+v %v", got, err)
	}
	if recordOf(t, b, wid) == nil {
		t.Error("a write finished without its record")
	}
	if calls.Load() != 1 || writes.Load() != 1 {
		t.Errorf("handler calls: read %d, write %d", calls.Load(), writes.Load())
	}
}

// A read whose worker is lost mid-call (its connection cut, no goodbye)
// runs again on another worker at the redelivery and completes: never
// OUTCOME_UNKNOWN, one envelope, two handler calls on the trail.
func TestReads_LostWorkerRunsAgain(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	var lostCalls, calls atomic.Int64
	started, never := make(chan struct{}, 1), make(chan struct{})
	lostConn := env.Connect(t)
	lease := 2 * time.Second
	lost := runWorkerOn(t, lostConn, executor.WorkerConfig{Lease: lease, Grace: time.Millisecond},
		gatedRead("t.read", &lostCalls, started, never))
	c := newClient(t, env.Connect(t))
	id, err := c.Submit(ctxT(t), "t.read", echoIn{Hello: "again"}, executor.As(alice))
	if err != nil {
		t.Fatal(err)
	}
	<-started
	waitUntil(t, "the first run's start is on the trail", func() bool {
		evs, err := c.Trail(ctxT(t), id)
		return err == nil && len(ofType(evs, audit.EventStarted)) == 1
	})
	lostConn.Close() // lost: it acknowledges nothing and writes nothing more
	released := make(chan struct{})
	close(released)
	startWorker(t, env.Connect(t), executor.WorkerConfig{Lease: lease}, gatedRead("t.read", &calls, make(chan struct{}, 1), released))
	got, err := c.Await(ctxT(t), id)
	if err != nil || got.Status != envelope.StatusCompleted {
		t.Fatalf("envelope %+v %v, want completed", got, err)
	}
	if got.Attempts != 1 || lostCalls.Load() != 1 || calls.Load() != 1 {
		t.Errorf("attempts %d; calls: lost worker %d, other %d", got.Attempts, lostCalls.Load(), calls.Load())
	}
	lost.Stop()
	flushAudit(t)
	evs := trail(t, c, id)
	if n := len(ofType(evs, audit.EventStarted)); n != 2 {
		t.Errorf("%d capability.started events, want 2 (one per run)", n)
	}
	if st := ofType(evs, audit.EventStarted); len(st) == 2 && (st[0].Data["delivery"] != nil || intValue(st[1].Data["delivery"]) < 2) {
		t.Errorf("the re-run's start does not name its delivery: %v, %v", st[0].Data, st[1].Data)
	}
}

// A caller's cancel stops a running read at once (CANCELLED, one attempt),
// and a cancel recorded while a read waits in its queue ends it without
// running it.
func TestReads_CancelRunningAndQueued(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	var calls atomic.Int64
	started := make(chan struct{}, 1)
	w, stop := runWorker(t, env.Connect(t), executor.WorkerConfig{}, gatedRead("t.read", &calls, started, nil))
	c := newClient(t, env.Connect(t))
	id, err := c.Submit(ctxT(t), "t.read", echoIn{}, executor.As(alice))
	if err != nil {
		t.Fatal(err)
	}
	<-started
	if _, err := c.Cancel(ctxT(t), id); err != nil {
		t.Fatal(err)
	}
	got, err := c.Await(ctxT(t), id)
	if err != nil {
		t.Fatal(err)
	}
	wantCancelled(t, got, 1)
	if n := w.Stats().HandlerCalls; n != 1 {
		t.Errorf("%d handler calls", n)
	}

	// Queued behind another read on a worker that runs one at a time: the
	// worker hears of the cancel, and the read ends without running.
	stop()
	var later atomic.Int64
	busy, release := make(chan struct{}, 1), make(chan struct{})
	startWorker(t, env.Connect(t), executor.WorkerConfig{Concurrency: 1}, gatedRead("t.read", &later, busy, release))
	first, err := c.Submit(ctxT(t), "t.read", echoIn{Hello: "first"}, executor.As(alice))
	if err != nil {
		t.Fatal(err)
	}
	<-busy
	queued, err := c.Submit(ctxT(t), "t.read", echoIn{Hello: "queued"}, executor.As(alice))
	if err != nil {
		t.Fatal(err)
	}
	if reply, err := c.Cancel(ctxT(t), queued); err != nil || reply.Finalized {
		t.Fatalf("cancel of the queued read: %+v %v", reply, err)
	}
	close(release)
	if got, err := c.Await(ctxT(t), first); err != nil || got.Status != envelope.StatusCompleted {
		t.Fatalf("the first read: %+v %v", got, err)
	}
	got, err = c.Await(ctxT(t), queued)
	if err != nil {
		t.Fatal(err)
	}
	wantCancelled(t, got, 0)
	if later.Load() != 1 {
		t.Errorf("%d handler calls, want the first read's alone", later.Load())
	}
}

// A read's attempt ends at its timeout, as any call's does, and a receipt
// is refused: without a claim there is no record to keep it.
func TestReads_TimeoutAndNoReceipt(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	var receiptErr atomic.Value
	startWorker(t, env.Connect(t), executor.WorkerConfig{},
		executor.Define("t.slow", executor.Meta{Description: "Times out.", Expose: executor.On(executor.SurfaceDirect),
			SideEffect: executor.SideEffectNone, Idempotent: true, Timeout: 100 * time.Millisecond},
			func(ctx context.Context, c executor.Call[echoIn]) (echoIn, error) {
				receiptErr.Store(c.Receipt(ctx, map[string]string{"seen": "x"}))
				<-ctx.Done()
				return echoIn{}, ctx.Err()
			}))
	c := newClient(t, env.Connect(t))
	got, err := c.Call(ctxT(t), "t.slow", echoIn{}, executor.As(alice))
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != envelope.StatusCancelled || got.Error == nil || got.Error.Code != envelope.CodeTimeout {
		t.Errorf("envelope %+v, want cancelled TIMEOUT", got)
	}
	if err, _ := receiptErr.Load().(error); !errors.Is(err, executor.ErrReceiptRefused) {
		t.Errorf("receipt of a read: %v, want refused", err)
	}
}

// A read's request sent again under its id after it ended, within the
// record window (a producer's retry past the duplicate window: the same
// message id, stored anew later than its id was made), finds the envelope
// and runs nothing, as a write's does by its record: the first delivery of
// a later publication reads the envelope before it runs.
func TestReads_SentAgainAfterItEnded_RunsNothing(t *testing.T) {
	t.Parallel()
	cfg := broker.Config{RecordWindow: 8 * time.Second} // a skew of 2 s
	env := testenv.Start(t)
	s := newStoreWith(t, env, cfg, executor.ClientConfig{})
	var p probe
	w := startWorker(t, env.Connect(t), executor.WorkerConfig{Deployment: executor.Deployment(cfg)},
		executor.Define("test.read", executor.Meta{Description: "Reads.", Expose: executor.On(executor.SurfaceDirect),
			SideEffect: executor.SideEffectRead, Idempotent: true},
			func(ctx context.Context, c executor.Call[map[string]any]) (probeOut, error) {
				p.called(ctx, c.Attempt)
				return probeOut{Attempt: c.Attempt}, nil
			}))
	id := envelope.NewExecutionID()
	s.publish("test.read", id)
	first := s.await(id)
	if first.Status != envelope.StatusCompleted {
		t.Fatalf("envelope %+v", first)
	}
	made, _ := envelope.ExecutionIDTime(id)
	waitUntil(t, "past the skew of the id's time", func() bool { return time.Since(made) > 3*time.Second })

	// Under a message id the duplicate window does not know, as it would
	// not know the first once it passed.
	s.publishCopy("test.read", id, broker.Key(broker.Anonymous, id)+".again")
	s.drained()
	if n, dups := p.calls.Load(), w.Stats().Duplicates; n != 1 || dups != 1 {
		t.Fatalf("handler called %d times, %d duplicates: want 1 and 1", n, dups)
	}
	if got := s.await(id); got.FinalizedAt != first.FinalizedAt || got.FinalizedBy != first.FinalizedBy {
		t.Fatalf("envelope rewritten: %+v", got)
	}
}

// A read whose worker shuts down while its handler runs is given back and
// runs again on another worker; the trail keeps the run the shutdown
// interrupted: two capability.started, one per handler call, however soon
// after its start the shutdown came.
func TestReads_WorkerShutDownMidRun_TrailKeepsBothRuns(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	var stoppedCalls, calls atomic.Int64
	started, never := make(chan struct{}, 1), make(chan struct{})
	stopping := runWorkerOn(t, env.Connect(t), executor.WorkerConfig{Grace: time.Millisecond},
		gatedRead("t.read", &stoppedCalls, started, never))
	c := newClient(t, env.Connect(t))
	id, err := c.Submit(ctxT(t), "t.read", echoIn{Hello: "again"}, executor.As(alice))
	if err != nil {
		t.Fatal(err)
	}
	<-started
	stopping.Stop()
	released := make(chan struct{})
	close(released)
	startWorker(t, env.Connect(t), executor.WorkerConfig{}, gatedRead("t.read", &calls, make(chan struct{}, 1), released))
	got, err := c.Await(ctxT(t), id)
	if err != nil || got.Status != envelope.StatusCompleted {
		t.Fatalf("envelope %+v %v, want completed", got, err)
	}
	flushAudit(t)
	evs := trail(t, c, id)
	if n := len(ofType(evs, audit.EventStarted)); n != 2 || stoppedCalls.Load() != 1 || calls.Load() != 1 {
		t.Errorf("%d capability.started for handler calls %d and %d: %v", n, stoppedCalls.Load(), calls.Load(), typesOf(evs))
	}
}

// A read running by a tagged id (a UUIDv7, a dash and a tag, as the MCP
// bridge and the TypeScript tools make an actor's ids) has neither record
// nor envelope yet: the workers read its trail from the UUIDv7's time, and
// say it runs, not that it is queued.
func TestReads_RunningByATaggedID_ReadWithItsTrail(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	var calls atomic.Int64
	started, release := make(chan struct{}, 1), make(chan struct{})
	defer close(release)
	startWorker(t, env.Connect(t), executor.WorkerConfig{}, gatedRead("t.read", &calls, started, release))
	c := newClient(t, env.Connect(t))
	ctx := ctxT(t)
	id := envelope.NewExecutionID() + "-0a1b2c3d4e5f"
	if _, err := c.Submit(ctx, "t.read", echoIn{}, executor.WithID(id)); err != nil {
		t.Fatal(err)
	}
	<-started
	var stored []audit.Event
	waitUntil(t, "the read's start on its trail", func() bool {
		stored, _ = c.Trail(ctx, id)
		return len(stored) >= 2
	})
	v, err := c.Execution(ctx, executor.ExecutionRequest{ExecutionID: id})
	if err != nil {
		t.Fatal(err)
	}
	if v.State != executor.ExecInFlight || len(v.Trail) != len(stored) {
		t.Errorf("a running read: %s with %d events, want %s with the %d its trail holds", v.State, len(v.Trail), executor.ExecInFlight, len(stored))
	}
}
