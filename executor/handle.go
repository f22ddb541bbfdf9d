package executor

import (
	"errors"
	"time"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/broker"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/nats-io/nats.go/jetstream"
)

// handle decides what one delivery means (DESIGN §5) and acts on it.
func (w *Worker) handle(msg jetstream.Msg) {
	req, err := envelope.DecodeRequest(msg.Data())
	if err != nil {
		w.undecodable(msg, err)
		return
	}
	if x := w.local(req.ExecutionID); x != nil {
		// A redelivery while this worker still runs the execution: the running
		// delivery's ack settles the message.
		nak(msg, w.cfg.Lease)
		return
	}
	x := w.newExecution(msg, req)
	if x.b == nil {
		w.notServedHere(msg, req)
		return
	}
	if !w.track(x) {
		nak(msg, w.cfg.Lease)
		return
	}
	defer w.untrack(x)
	defer x.finish()
	x.claimAndRun()
}

func (x *execution) finish() {
	close(x.done)
	x.stopDeadline()
	x.cancel(nil)
}

// claimAndRun claims the execution and runs it, or decides from the record
// another delivery or worker left.
func (x *execution) claimAndRun() {
	w := x.w
	x.hashInput()
	now := time.Now().UTC()
	rec := &Record{
		V: envelope.Version, ExecutionID: x.req.ExecutionID, CapabilityID: x.req.CapabilityID,
		State: StateClaimed, Worker: w.cfg.ID, LeaseUntil: now.Add(w.cfg.Lease),
		ApprovalID: x.req.ApprovalID, CreatedAt: now, UpdatedAt: now,
	}
	for try := 0; try < 10; try++ {
		ctx, cancel := storeCtx()
		rev, err := broker.Create(ctx, w.b.Executions, x.req.ExecutionID, rec)
		cancel()
		if err == nil {
			x.rec, x.rev = rec, rev
			x.run(true, 0, "")
			return
		}
		if !errors.Is(err, broker.ErrExists) {
			// The create may have happened: re-read below decides either way.
			time.Sleep(backoffStep(try))
		}
		ctx, cancel = storeCtx()
		cur, curRev, err := broker.Load[Record](ctx, w.b.Executions, x.req.ExecutionID)
		cancel()
		if errors.Is(err, broker.ErrNotFound) {
			continue
		}
		if err != nil {
			w.log.Warn("read execution record", "executionId", x.req.ExecutionID, "err", err)
			nak(x.msg, time.Second)
			return
		}
		if cur.Worker == w.cfg.ID && cur.State == StateClaimed && cur.CreatedAt.Equal(rec.CreatedAt) {
			// Our own create, whose answer was lost.
			x.rec, x.rev = cur, curRev
			x.run(true, 0, "")
			return
		}
		x.decide(cur, curRev)
		return
	}
	nak(x.msg, time.Second)
}

// decide handles a delivery whose execution already has a record: the
// takeover table of DESIGN §5.
func (x *execution) decide(rec *Record, rev uint64) {
	w := x.w
	if rec.State == StateFinalized || x.envelopeExists() {
		w.duplicate(x.msg, x.req, rec.Worker)
		return
	}
	now := time.Now().UTC()
	if rec.leaseLive(now) && rec.State != StatePending {
		nak(x.msg, rec.LeaseUntil.Sub(now)+50*time.Millisecond)
		return
	}
	from := rec.Worker
	prev := rec.State
	x.rec, x.rev = rec, rev
	if err := x.update(func(r *Record) {
		r.Worker = w.cfg.ID
		r.LeaseUntil = time.Now().UTC().Add(w.cfg.Lease)
		if r.State == StatePending {
			// A cancel's record knew only the id.
			r.State, r.CapabilityID, r.ApprovalID = StateClaimed, x.req.CapabilityID, x.req.ApprovalID
		}
	}); err != nil && !errors.Is(err, errCancelRequested) {
		// Someone else moved first; the next delivery decides again.
		nak(x.msg, time.Second)
		return
	}
	if prev == StatePending {
		// A cancel came first and left the record; the request itself was
		// never audited.
		x.emit(audit.Requested, nil)
	} else {
		w.takenOver.Add(1)
		x.emit(audit.TakenOver, map[string]any{"fromWorker": from, "state": string(prev), "attempt": rec.Attempt})
	}
	if x.rec.CancelRequested {
		x.finalize(x.cancelled(envelope.CodeCancelled, "The caller cancelled the execution."), x.rec.Attempt)
		return
	}
	switch prev {
	case StatePending, StateClaimed:
		// The handler never started: run from the top.
		x.run(false, 0, "")
	case StateRunning, StateBackoff:
		n := x.rec.Attempt
		lost := &envelope.CapabilityError{Code: envelope.CodeWorkerLost, Stage: envelope.StageHandler, Retryable: true,
			Message: "The worker running the attempt was lost."}
		if x.retryEligible(lost) && n < 1+x.b.meta.maxAttempts() {
			x.run(false, n+1, envelope.CodeWorkerLost)
			return
		}
		if prev == StateBackoff && x.rec.LastError != "" {
			// The attempt failed and was recorded; only its retry was lost.
			last := &envelope.CapabilityError{Code: x.rec.LastError, Stage: envelope.StageHandler, Retryable: true,
				Message: "The operation failed.", ExposeToModel: false}
			if last.Code == envelope.CodeTimeout {
				last = x.timeoutError()
			}
			x.finalize(x.afterRun(last), n)
			return
		}
		x.finalize(x.failed(&envelope.CapabilityError{
			Code: envelope.CodeOutcomeUnknown, Stage: envelope.StageHandler, ExposeToModel: true,
			Message: "The worker running this operation was lost; it may or may not have taken effect.",
		}), n)
	default:
		x.run(false, 0, "")
	}
}

func (x *execution) envelopeExists() bool {
	ctx, cancel := storeCtx()
	defer cancel()
	_, err := x.w.b.Envelopes.Get(ctx, x.req.ExecutionID)
	return err == nil
}

// duplicate acknowledges a delivery of an execution that is already finalized:
// never a new attempt.
func (w *Worker) duplicate(msg jetstream.Msg, req *envelope.Request, finalizedBy string) {
	w.duplicates.Add(1)
	w.emit(&audit.Event{Type: audit.DuplicateDelivery, Surface: req.Surface, Actor: audit.ActorOf(req.Actor),
		ExecutionID: req.ExecutionID, CapabilityID: req.CapabilityID, CorrelationID: req.CorrelationID,
		Data: map[string]any{"finalizedBy": finalizedBy}})
	ackSync(msg)
}

// undecodable terminates a message that is not a request: it must not be
// redelivered forever. With a usable execution id header, it is finalized as
// INPUT_INVALID so that its caller is not left waiting.
func (w *Worker) undecodable(msg jetstream.Msg, derr error) {
	id := ""
	if h := msg.Headers(); h != nil {
		id = h.Get("Nats-Msg-Id")
	}
	w.log.Warn("request does not decode: terminated", "subject", msg.Subject(), "executionId", id, "err", derr)
	if envelope.ValidExecutionID(id) == nil {
		capID := w.b.Names.CapabilityFromSubject(msg.Subject())
		env := &envelope.Envelope{ExecutionID: id, CapabilityID: capID, Status: envelope.StatusFailed,
			Error: &envelope.Error{Code: envelope.CodeInputInvalid, Stage: envelope.StageInput, ExposeToModel: true,
				Message: "The request could not be decoded."}}
		x := &execution{w: w, req: &envelope.Request{ExecutionID: id, CapabilityID: capID}}
		w.finalizeWithoutRun(x, env, "undecodable")
	}
	_ = msg.TermWithReason("request does not decode")
}

// notServedHere handles a request for a capability this worker lacks. During a
// rolling deploy a newer worker may serve it: wait while the catalog lists it.
func (w *Worker) notServedHere(msg jetstream.Msg, req *envelope.Request) {
	if _, listed := w.cat.lookup(req.CapabilityID); listed && envelope.ValidCapabilityID(req.CapabilityID) == nil {
		nak(msg, w.cfg.RolloutDelay)
		return
	}
	w.notFound(msg, req, "unknown")
}

// notFound finalizes a request for a capability no pool serves.
func (w *Worker) notFound(msg jetstream.Msg, req *envelope.Request, reason string) {
	x := &execution{w: w, req: req}
	x.hashInput()
	env := &envelope.Envelope{ExecutionID: req.ExecutionID, CapabilityID: req.CapabilityID, Status: envelope.StatusFailed,
		Error: notFoundError().Wire()}
	w.finalizeWithoutRun(x, env, reason)
	ackSync(msg)
}

// finalizeWithoutRun writes a finalized record, its trail (requested, denied
// for reason, failed), then the envelope, for an execution refused before it
// could run. If a record exists, another delivery owns the id: nothing is
// written, not even to the trail.
func (w *Worker) finalizeWithoutRun(x *execution, env *envelope.Envelope, reason string) {
	id, capID := x.req.ExecutionID, x.req.CapabilityID
	ctx, cancel := storeCtx()
	defer cancel()
	if _, err := broker.Create(ctx, w.b.Executions, id, w.finalizedRecord(id, capID, env.Status)); err != nil {
		return
	}
	x.emit(audit.Requested, nil)
	x.emit(audit.Denied, map[string]any{"reason": reason, "publicCode": string(env.Error.Code), "stage": env.Error.Stage})
	x.emit(audit.Failed, map[string]any{"code": string(env.Error.Code), "stage": env.Error.Stage,
		"retryable": false, "attempts": 0, "executedBeforeFailure": false})
	env.V = envelope.Version
	env.FinalizedBy = w.cfg.ID
	env.FinalizedAt = time.Now().UTC()
	if _, err := broker.Create(ctx, w.b.Envelopes, id, env); err == nil {
		w.finalized.Add(1)
	}
}

// handleUnrouted serves the _unrouted consumer: requests a producer sent there
// because its catalog did not list the capability.
func (w *Worker) handleUnrouted(msg jetstream.Msg) {
	req, err := envelope.DecodeRequest(msg.Data())
	if err != nil {
		w.undecodable(msg, err)
		return
	}
	if _, listed := w.cat.lookup(req.CapabilityID); listed && envelope.ValidCapabilityID(req.CapabilityID) == nil {
		// The producer's catalog was stale: forward under a distinct message id,
		// since the original id is still in the dedup window.
		ctx, cancel := storeCtx()
		defer cancel()
		fwd := msg.Data()
		if _, err := w.b.JS.Publish(ctx, w.b.Names.ExecSubject(req.CapabilityID), fwd,
			jetstream.WithMsgID(req.ExecutionID+"-fwd")); err != nil {
			nak(msg, time.Second)
			return
		}
		ackSync(msg)
		return
	}
	if envelope.ValidCapabilityID(req.CapabilityID) != nil {
		w.notFound(msg, req, "invalid-id")
		return
	}
	w.notFound(msg, req, "unknown")
}
