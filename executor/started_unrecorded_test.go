package executor_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/execution"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// NOT_STARTED tells the model that the operation never ran (DESIGN §13). A
// request whose non-idempotent attempt started, whose worker was lost, and
// whose pool stayed down longer than the record window has no record left
// when it is seen again past its start deadline: the missing record does not
// prove that it never started, so it must end OUTCOME_UNKNOWN, as the
// redelivery of such a request before its start deadline does
// (TestRecordWindow_RedeliveryAfterTheRecordExpired_OutcomeUnknownNoSecondAttempt).
func TestStartDeadline_StartedAttemptWhoseRecordWent_NeverNotStarted(t *testing.T) {
	t.Parallel()
	for _, by := range []string{"delivery", "sweeper"} {
		t.Run(by, func(t *testing.T) {
			cfg := broker.Config{RecordWindow: 2 * time.Second}
			env := testenv.Start(t)
			s := newStoreWith(t, env, cfg, executor.ClientConfig{})
			var p probe
			started, _ := holdUntilDone(&p)
			lostConn := env.Connect(t)
			s.runWorker(lostConn, executor.WorkerConfig{Pool: "p", Lease: time.Second, Deployment: executor.Deployment(cfg), SweepInterval: -1}, sendCap(&p))
			// The start window is the record window: once the record has gone,
			// the start deadline has passed too.
			id, err := s.c.Submit(ctxT(t), "test.send", map[string]any{"n": 1}, executor.StartWithin(cfg.RecordWindow))
			if err != nil {
				t.Fatal(err)
			}
			waitClosed(t, started, "the handler never started")
			lostConn.Close() // the worker is lost mid-attempt; its pool is down
			s.waitRecordGone(id)

			if by == "delivery" {
				// The pool comes back and receives the request again.
				s.runWorker(env.Connect(t), executor.WorkerConfig{Pool: "p", Lease: time.Second, Deployment: executor.Deployment(cfg), SweepInterval: -1}, sendCap(&p))
			} else {
				// The pool stays down; a worker of another pool sweeps.
				s.runWorker(env.Connect(t), executor.WorkerConfig{Pool: "other", Deployment: executor.Deployment(cfg), SweepInterval: 50 * time.Millisecond}, echoCap(nil))
			}
			got := s.await(id)
			if n := p.calls.Load(); n != 1 {
				t.Fatalf("handler called %d times, want the lost attempt only", n)
			}
			if got.Status != envelope.StatusFailed || got.Error == nil || got.Error.Code != envelope.CodeOutcomeUnknown {
				t.Fatalf("envelope %s after %d attempts, error %+v: the attempt ran, want OUTCOME_UNKNOWN", got.Status, got.Attempts, got.Error)
			}
		})
	}
}

// Every accepted request ends in one envelope (DESIGN §13), even when a
// cancel reached it first and left a pending record. A request refused
// before it could run — a resume naming an approval that is not the
// principal's, or a request that does not decode but carries a usable
// execution id — must not be acknowledged (or terminated) until its
// envelope exists: once its message has left the work-queue stream, nothing
// will ever finalize it.
func TestCancelledFirst_RequestRefusedBeforeItRuns_StillEndsInAnEnvelope(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"resume-refused", "undecodable"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			env := testenv.Start(t)
			s := newStore(t, env)
			var p probe
			s.runWorker(env.Connect(t), executor.WorkerConfig{SweepInterval: -1}, sendCap(&p))
			id := envelope.NewExecutionID()
			reply, err := s.c.Cancel(ctxT(t), id)
			if err != nil || reply.State != execution.StatePending {
				t.Fatalf("cancel before the request: %+v, %v", reply, err)
			}
			switch kind {
			case "resume-refused":
				// A resume naming only its approval, which does not exist.
				s.publishRequest(s.b.Names.UnroutedSubject(broker.Anonymous),
					&envelope.Request{ExecutionID: id, ApprovalID: envelope.NewExecutionID()})
			case "undecodable":
				m := nats.NewMsg(s.b.Names.ExecSubject(broker.Anonymous, "test.send"))
				m.Data = []byte{0xc1} // never valid msgpack
				m.Header.Set(jetstream.MsgIDHeader, id)
				if _, err := s.b.JS.PublishMsg(ctxT(t), m); err != nil {
					t.Fatal(err)
				}
			}
			// The request has left the stream: whatever finalizes it has been
			// written by now, or never will be.
			s.drained()
			if _, _, err := broker.Load[envelope.Envelope](ctxT(t), s.b.Envelopes, broker.Key(broker.Anonymous, id)); err != nil {
				rec, _ := s.record(id)
				t.Fatalf("request gone from the stream, no envelope (%v); record left %s, cancelRequested %v", err, rec.State, rec.CancelRequested)
			}
			if n := p.calls.Load(); n != 0 {
				t.Fatalf("handler called %d times", n)
			}
		})
	}
}

// A request refused before its claim on the short path (stages 4 to 9 run
// before anything is written) is finalized as a finalized record first, then
// its envelope. A worker that writes the record but not the envelope (lost
// between the two writes; here the envelopes refuse every write until it
// stops) leaves the request queued, and the next delivery must write the
// envelope the record stands for, as it does for NOT_STARTED: acknowledging
// it as a duplicate of an envelope that does not exist ends the request with
// none.
func TestShortPathRefusal_RecordWrittenEnvelopeNot_NextDeliveryWritesIt(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	s := newStore(t, env)
	var p probe
	cfg := executor.WorkerConfig{ID: "refused", Lease: time.Second, Grace: 50 * time.Millisecond, SweepInterval: -1}
	_, stop := runWorker(t, env.Connect(t), cfg, sendCap(&p))
	envelopes := "KV_" + s.b.Names.EnvelopesBucket()
	size := s.setMaxMsgSize(envelopes, 1)
	id := envelope.NewExecutionID()
	// An actor of no known kind: refused at stage 6, before any claim.
	s.publishRequest(s.b.Names.ExecSubject(broker.Anonymous, "test.send"), &envelope.Request{ExecutionID: id,
		CapabilityID: "test.send", Input: envelope.MustRaw(map[string]any{"n": 1}), Actor: envelope.Actor{Kind: "robot", ID: "r"}})
	// The outcome is on the trail before its envelope is tried.
	s.waitEvent(id, audit.EventFailed)
	stop() // the worker gives up on the envelope as it shuts down
	if rec, _ := s.record(id); rec.State != execution.StateFinalized {
		t.Fatalf("record %s, want the finalized record the refusal writes before its envelope", rec.State)
	}
	info, err := s.b.Exec.Info(ctxT(t))
	if err != nil || info.State.Msgs != 1 {
		t.Fatalf("the exec stream holds %d requests (%v), want the unfinalized one", info.State.Msgs, err)
	}

	s.setMaxMsgSize(envelopes, size)
	cfg.ID = "next"
	startWorker(t, env.Connect(t), cfg, sendCap(&p))
	s.drained()
	got, _, err := broker.Load[envelope.Envelope](ctxT(t), s.b.Envelopes, broker.Key(broker.Anonymous, id))
	if err != nil {
		t.Fatalf("request acknowledged, no envelope: %v", err)
	}
	if got.Status != envelope.StatusFailed || got.Error == nil || got.Error.Code != envelope.CodeUnauthenticated {
		t.Fatalf("envelope %s, error %+v; want the refusal UNAUTHENTICATED", got.Status, got.Error)
	}
	if n := p.calls.Load(); n != 0 {
		t.Fatalf("handler called %d times", n)
	}
}

// A duplicate never causes a second attempt of non-idempotent work (DESIGN
// §5). Here a non-idempotent attempt starts, its worker is lost, and its
// pool stays down longer than the record window and the lease, so the
// record goes (a record outlives its lease: it goes a window after its last
// write, or when its lease ran out, whichever is later). The producer sends
// the same request again under another message id (a retry past the
// duplicate window). The copy is a first delivery, but of an id older than
// the record window: the missing record proves nothing, and neither it nor
// the original's redelivery may run attempt 1 again.
func TestRecordWindow_CopyAfterTheRecordExpired_NoSecondAttempt(t *testing.T) {
	t.Parallel()
	cfg := broker.Config{RecordWindow: 2 * time.Second}
	env := testenv.Start(t)
	s := newStoreWith(t, env, cfg, executor.ClientConfig{})
	var p probe
	// The first attempt holds until its context ends; any later one returns
	// at once.
	started := make(chan struct{})
	var first atomic.Bool
	p.gate = func(ctx context.Context, _ int) {
		if first.CompareAndSwap(false, true) {
			close(started)
			<-ctx.Done() // bounded: the worker's shutdown ends it
		}
	}
	wcfg := executor.WorkerConfig{Pool: "p", Lease: time.Second, Grace: 50 * time.Millisecond, Deployment: executor.Deployment(cfg), SweepInterval: -1}
	lostConn := env.Connect(t)
	s.runWorker(lostConn, wcfg, sendCap(&p))
	id := envelope.NewExecutionID()
	s.publish("test.send", id)
	waitClosed(t, started, "the handler never started")
	lostConn.Close() // the worker is lost mid-attempt; its pool is down
	s.waitRecordGone(id)

	s.publishCopy("test.send", id, broker.Key(broker.Anonymous, id)+".again")
	s.runWorker(env.Connect(t), wcfg, sendCap(&p))
	got := s.await(id)
	if n := p.calls.Load(); n != 1 {
		t.Fatalf("handler called %d times (envelope %s after %d attempts): a copy of a request whose attempt was lost ran it again",
			n, got.Status, got.Attempts)
	}
	if got.Status != envelope.StatusFailed || got.Error == nil || got.Error.Code != envelope.CodeOutcomeUnknown {
		t.Fatalf("envelope %s, error %+v; want OUTCOME_UNKNOWN", got.Status, got.Error)
	}
}

// A request that ended NOT_STARTED and is delivered again (a copy under
// another message id; a redelivery whose acknowledgement was lost alike) is
// a duplicate delivery on its trail, as any delivery of an ended execution
// is (DESIGN §5, §8): not a second capability.requested and a second
// terminal event, which would read as another call of the same execution.
func TestStartDeadline_EndedRequestDeliveredAgain_AuditedAsADuplicate(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	s := newStore(t, env)
	var p probe
	startWorker(t, env.Connect(t), executor.WorkerConfig{SweepInterval: -1}, sendCap(&p))
	startBy := pastLease()
	req := &envelope.Request{ExecutionID: envelope.NewExecutionID(), CapabilityID: "test.send",
		Input: envelope.MustRaw(map[string]any{"n": 1}), StartBy: &startBy}
	subject := s.b.Names.ExecSubject(broker.Anonymous, "test.send")
	s.publishRequest(subject, req)
	checkNotStarted(t, s.await(req.ExecutionID))
	s.settled(req.ExecutionID)

	data, err := envelope.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	m := nats.NewMsg(subject)
	m.Data = data
	m.Header.Set(jetstream.MsgIDHeader, broker.Key(broker.Anonymous, req.ExecutionID)+".again")
	if _, err := s.b.JS.PublishMsg(ctxT(t), m); err != nil {
		t.Fatal(err)
	}
	tr := s.settled(req.ExecutionID)
	if count(tr, audit.EventRequested) != 1 || count(tr, audit.EventFailed) != 1 || count(tr, audit.EventDuplicateDelivery) != 1 {
		t.Fatalf("trail %v: want one requested, one failed, and the second delivery as a duplicate", typesOf(tr))
	}
	if n := s.envelopeWrites(); n != 1 || p.calls.Load() != 0 {
		t.Fatalf("%d envelope writes, %d handler calls", n, p.calls.Load())
	}
}
