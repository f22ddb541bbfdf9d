package executor_test

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/execution"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// waitRecordGone waits until id's record has been removed by its TTL.
func (s *store) waitRecordGone(id string) {
	s.t.Helper()
	ctx := ctxT(s.t)
	for {
		_, err := s.b.Executions.Get(ctx, broker.Key(broker.Anonymous, id))
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return
		}
		select {
		case <-ctx.Done():
			s.t.Fatalf("the record of %s never expired: %v", id, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// An execution's record goes one record window after its last write (DESIGN
// §16); its envelope stays. A request of the same id sent again afterwards
// (a producer's retry past the duplicate window) finds the envelope and runs
// nothing: the handler ran once. The lease is shorter than the window: an
// unfinalized write carries at least what is left of its lease as TTL, and
// the default lease would keep the record 30 s.
func TestRecordWindow_RecordGoes_ResubmitRunsNothingTwice(t *testing.T) {
	t.Parallel()
	cfg := broker.Config{RecordWindow: 2 * time.Second}
	env := testenv.Start(t)
	s := newStoreWith(t, env, cfg, executor.ClientConfig{})
	var p probe
	w := startWorker(t, env.Connect(t), executor.WorkerConfig{Deployment: executor.Deployment(cfg), Lease: time.Second}, sendCap(&p))
	id := envelope.NewExecutionID()
	s.publish("test.send", id)
	first := s.await(id)
	if first.Status != envelope.StatusCompleted {
		t.Fatalf("envelope %+v", first)
	}
	s.waitRecordGone(id)
	if _, _, err := broker.Load[envelope.Envelope](ctxT(t), s.b.Envelopes, broker.Key(broker.Anonymous, id)); err != nil {
		t.Fatalf("the envelope went with the record: %v", err)
	}

	// The same request again, under a message id the duplicate window does
	// not know.
	s.publishCopy("test.send", id, broker.Key(broker.Anonymous, id)+".again")
	waitUntil(t, "the second delivery acknowledged as a duplicate", func() bool { return w.Stats().Duplicates == 1 })
	s.drained()
	if n := p.calls.Load(); n != 1 {
		t.Fatalf("handler called %d times, want 1", n)
	}
	if got := s.await(id); got.FinalizedAt != first.FinalizedAt || got.FinalizedBy != first.FinalizedBy {
		t.Fatalf("envelope rewritten: %+v", got)
	}
}

// A delivery that comes back after its execution's record expired unwritten
// (a worker lost mid-attempt, its pool down longer than the record window)
// cannot tell whether an attempt ran: a capability not eligible for a retry
// ends OUTCOME_UNKNOWN, never a second attempt.
func TestRecordWindow_RedeliveryAfterTheRecordExpired_OutcomeUnknownNoSecondAttempt(t *testing.T) {
	t.Parallel()
	cfg := broker.Config{RecordWindow: 2 * time.Second}
	env := testenv.Start(t)
	s := newStoreWith(t, env, cfg, executor.ClientConfig{})
	var p probe
	started, _ := holdUntilDone(&p)
	lostConn := env.Connect(t)
	s.runWorker(lostConn, executor.WorkerConfig{Pool: "p", Lease: time.Second, Deployment: executor.Deployment(cfg), SweepInterval: -1}, sendCap(&p))
	id, err := s.c.Submit(ctxT(t), "test.send", map[string]any{"n": 1})
	if err != nil {
		t.Fatal(err)
	}
	waitClosed(t, started, "the handler never started")
	lostConn.Close() // the worker is lost mid-attempt; its pool is down
	s.waitRecordGone(id)

	s.runWorker(env.Connect(t), executor.WorkerConfig{Pool: "p", Lease: time.Second, Deployment: executor.Deployment(cfg), SweepInterval: -1}, sendCap(&p))
	got := s.await(id)
	if got.Status != envelope.StatusFailed || got.Error == nil || got.Error.Code != envelope.CodeOutcomeUnknown {
		t.Fatalf("envelope %s, error %+v; want OUTCOME_UNKNOWN", got.Status, got.Error)
	}
	s.drained()
	if n := p.calls.Load(); n != 1 {
		t.Fatalf("handler called %d times, want the lost attempt only", n)
	}
}

// A request whose id is older than envelopes are kept cannot be told from
// one that ran and whose envelope expired: it is refused, audited
// execution.expired_request, and never run (DESIGN §16).
func TestExpiredRequest_IDOlderThanTheEnvelopeRetention_RefusedNeverRun(t *testing.T) {
	t.Parallel()
	cfg := broker.Config{EnvelopeRetention: 3 * time.Second}
	env := testenv.Start(t)
	s := newStoreWith(t, env, cfg, executor.ClientConfig{})
	var p probe
	s.runWorker(env.Connect(t), executor.WorkerConfig{Deployment: executor.Deployment{}}, sendCap(&p))
	id := uuidV7At(time.Now().Add(-time.Minute))
	s.publish("test.send", id)
	waitUntil(t, "execution.expired_request on the trail", func() bool {
		trail, _ := audit.Read(ctxT(t), s.b.NC, s.b.Names.Prefix(), broker.Anonymous, id)
		return len(trail) > 0 && trail[len(trail)-1].Type == audit.EventExpiredRequest
	})
	s.drained()
	if n := p.calls.Load(); n != 0 {
		t.Fatalf("handler called %d times", n)
	}
	if _, _, err := broker.Load[envelope.Envelope](ctxT(t), s.b.Envelopes, broker.Key(broker.Anonymous, id)); !errors.Is(err, broker.ErrNotFound) {
		t.Fatalf("an envelope for a refused request: %v", err)
	}
	// A fresh request of the same capability runs.
	if got, err := s.c.Call(ctxT(t), "test.send", map[string]any{"n": 2}); err != nil || got.Status != envelope.StatusCompleted {
		t.Fatalf("a new request: %v %+v", err, got)
	}
}

// A cancel's write carries the record window as its TTL, as every write of a
// worker does (DESIGN §16): a cancel recorded on the record of an execution
// whose worker was lost, and that nothing writes again, leaves that record
// to go one window later, not to stay for the record TTL.
func TestRecordWindow_CancelOfALostExecution_RecordStillGoes(t *testing.T) {
	t.Parallel()
	cfg := broker.Config{RecordWindow: 2 * time.Second}
	env := testenv.Start(t)
	s := newStoreWith(t, env, cfg, executor.ClientConfig{})
	var p probe
	s.runWorker(env.Connect(t), executor.WorkerConfig{Deployment: executor.Deployment(cfg), SweepInterval: -1}, sendCap(&p))
	id := envelope.NewExecutionID()
	s.putRecord(&execution.Record{ExecutionID: id, CapabilityID: "test.send", State: execution.StateRunning, Attempt: 1,
		Worker: deadWorker, Claim: "dead-claim", LeaseUntil: pastLease(), StartedAt: pastLease()})
	reply, err := s.c.Cancel(ctxT(t), id)
	if err != nil || reply.Finalized {
		t.Fatalf("cancel: %+v, %v", reply, err)
	}
	if rec, _ := s.record(id); !rec.CancelRequested {
		t.Fatalf("record %+v: the cancel was not recorded", rec)
	}
	s.waitRecordGone(id)
}

// A record never expires under its own live lease (DESIGN §5, §16): with a
// record window shorter than a third of the lease, a handler that runs until
// its lease has been renewed outlives the window. Its record must still be
// there at every moment, the renewal must find it, and the execution complete
// once. Were the record to go between two renewals, the worker would take its
// own execution for lost, and a redelivery would find no record where a live
// lease should stand.
//
// The window is 3 s, not less: a first delivery that comes later than the
// window after its id was made proves nothing by finding no record, and ends
// OUTCOME_UNKNOWN (the takeover table's rule), which a loaded machine reached
// with a 1 s window.
func TestRecordWindow_ShorterThanTheLease_RecordOutlivesItsLiveLease(t *testing.T) {
	t.Parallel()
	cfg := broker.Config{RecordWindow: 3 * time.Second}
	env := testenv.Start(t)
	s := newStoreWith(t, env, cfg, executor.ClientConfig{})
	id := envelope.NewExecutionID()
	key := broker.Key(broker.Anonymous, id)
	var missing, renewed atomic.Bool
	p := probe{gate: func(ctx context.Context, _ int) {
		// Polls the record until a lease renewal rewrote it (the record's
		// revision moves on), or the context ends (the worker took its own
		// execution for lost).
		var first uint64
		for ctx.Err() == nil {
			e, err := s.b.Executions.Get(ctx, key)
			switch {
			case errors.Is(err, jetstream.ErrKeyNotFound):
				missing.Store(true)
			case err == nil && first == 0:
				first = e.Revision()
			case err == nil && e.Revision() > first:
				renewed.Store(true)
				return
			}
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}}
	startWorker(t, env.Connect(t), executor.WorkerConfig{Lease: 12 * time.Second, Deployment: executor.Deployment(cfg), SweepInterval: -1}, sendCap(&p))
	s.publish("test.send", id)
	got := s.await(id)
	if missing.Load() {
		t.Errorf("the record of a running execution expired under its live lease")
	}
	if !renewed.Load() {
		t.Errorf("the handler never saw its lease renewed")
	}
	if got.Status != envelope.StatusCompleted {
		t.Errorf("envelope %s, error %+v; want completed", got.Status, got.Error)
	}
	if n := p.calls.Load(); n != 1 {
		t.Errorf("handler called %d times, want 1", n)
	}
}

// A worker follows a change of the envelope retention made after it started
// (a server restarted with a longer --envelope-retention, DESIGN §16): a
// request whose id the retention read at the worker's start calls too old,
// but that the retention now kept accepts (clients opened since give it a
// start window that long), runs. Refused by the start-time value, it would
// be terminated without an envelope while its caller, reading the bucket's
// new TTL, waits for one.
func TestExpiredRequest_RetentionGrownAfterTheWorkerStarted_RequestRuns(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	s := newStoreWith(t, env, broker.Config{EnvelopeRetention: 30 * time.Second}, executor.ClientConfig{})
	var p probe
	startWorker(t, env.Connect(t), executor.WorkerConfig{SweepInterval: -1}, sendCap(&p))
	// A server grows the retention to an hour while the worker runs.
	if _, err := broker.Provision(ctxT(t), env.Connect(t), broker.Config{EnvelopeRetention: time.Hour, Logger: slog.New(slog.DiscardHandler)}); err != nil {
		t.Fatal(err)
	}
	id := uuidV7At(time.Now().Add(-time.Minute)) // past 30 s less the margin, well within an hour
	s.publish("test.send", id)
	var refused bool
	waitUntil(t, "an envelope, or execution.expired_request on the trail", func() bool {
		if _, _, err := broker.Load[envelope.Envelope](ctxT(t), s.b.Envelopes, broker.Key(broker.Anonymous, id)); err == nil {
			return true
		}
		trail, _ := audit.Read(ctxT(t), s.b.NC, s.b.Names.Prefix(), broker.Anonymous, id)
		refused = len(trail) > 0 && trail[len(trail)-1].Type == audit.EventExpiredRequest
		return refused
	})
	if refused {
		t.Fatalf("refused by the retention read at the worker's start, with no envelope: its caller waits for ever")
	}
	if got := s.await(id); got.Status != envelope.StatusCompleted {
		t.Fatalf("envelope %s, error %+v; want completed", got.Status, got.Error)
	}
	if n := p.calls.Load(); n != 1 {
		t.Fatalf("handler called %d times, want 1", n)
	}
}

// A retention shrunk after the worker started (a server restarted with a
// shorter --envelope-retention) is followed within a catalog renewal: from
// then on a request whose id is older than the new retention is refused, as
// any envelope of it may be gone.
func TestExpiredRequest_RetentionShrunkAfterTheWorkerStarted_FollowedWithinARenewal(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	s := newStoreWith(t, env, broker.Config{EnvelopeRetention: time.Hour}, executor.ClientConfig{})
	var p probe
	startWorker(t, env.Connect(t), executor.WorkerConfig{SweepInterval: -1, CatalogTTL: 600 * time.Millisecond}, sendCap(&p))
	if _, err := broker.Provision(ctxT(t), env.Connect(t), broker.Config{EnvelopeRetention: 30 * time.Second, Logger: slog.New(slog.DiscardHandler)}); err != nil {
		t.Fatal(err)
	}
	// Requests of a minute-old id, one after the other, until one is refused.
	waitUntil(t, "a request older than the shrunk retention refused", func() bool {
		id := uuidV7At(time.Now().Add(-time.Minute))
		s.publish("test.send", id)
		var refused bool
		waitUntil(t, "an envelope, or execution.expired_request on the trail", func() bool {
			if _, _, err := broker.Load[envelope.Envelope](ctxT(t), s.b.Envelopes, broker.Key(broker.Anonymous, id)); err == nil {
				return true
			}
			trail, _ := audit.Read(ctxT(t), s.b.NC, s.b.Names.Prefix(), broker.Anonymous, id)
			refused = len(trail) > 0 && trail[len(trail)-1].Type == audit.EventExpiredRequest
			return refused
		})
		return refused
	})
}

// A cancel of an execution that ended says so, with its outcome, for as long
// as its envelope is kept, not only while its record is (DESIGN §16: the
// envelope outlives the record); it records nothing.
func TestRecordWindow_CancelAfterTheRecordWent_SaysItEnded(t *testing.T) {
	t.Parallel()
	cfg := broker.Config{RecordWindow: 2 * time.Second}
	env := testenv.Start(t)
	s := newStoreWith(t, env, cfg, executor.ClientConfig{})
	var p probe
	startWorker(t, env.Connect(t), executor.WorkerConfig{Deployment: executor.Deployment(cfg), Lease: time.Second}, sendCap(&p))
	id := envelope.NewExecutionID()
	s.publish("test.send", id)
	if first := s.await(id); first.Status != envelope.StatusCompleted {
		t.Fatalf("envelope %+v", first)
	}
	s.waitRecordGone(id)
	reply, err := s.c.Cancel(ctxT(t), id)
	if err != nil {
		t.Fatal(err)
	}
	if !reply.Finalized || reply.Status != envelope.StatusCompleted {
		t.Fatalf("cancel reply %+v, want finalized completed", reply)
	}
	if _, err := s.b.Executions.Get(ctxT(t), broker.Key(broker.Anonymous, id)); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("the cancel wrote a record: %v", err)
	}
}
