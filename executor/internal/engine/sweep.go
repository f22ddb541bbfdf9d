package engine

import (
	"context"
	"errors"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/broker"
)

// Ending an execution no delivery carries: what the sweeper (package
// sweeper) asks of the engine for a request past its deadline, once its own
// table (DESIGN §13) has decided. The engine writes, as it does for a
// delivery: the record by compare-and-swap, the trail, the one envelope.

// Record reads principal's execution id's record and its revision.
func (r *Runner) Record(principal, id string) (*Record, uint64, error) {
	ctx, cancel := StoreContext()
	defer cancel()
	return broker.Load[Record](ctx, r.w.b.Executions, broker.Key(principal, id))
}

// Envelope reads what is stored of principal's execution id's envelope.
func (r *Runner) Envelope(principal, id string) EnvelopeRead {
	return classifyEnvelope(r.w.store.envelope(broker.Key(principal, id)))
}

// EndUnrun ends req, which has no record, with cerr and reports whether its
// envelope exists: a finalized record (create-only, so that no worker claims
// it meanwhile), the trail, then the envelope (execution.endUnrun).
func (r *Runner) EndUnrun(req *envelope.Request, principal string, cerr *envelope.CapabilityError) bool {
	x := newExecution(r.w, req, principal, Delivery{ID: req.ExecutionID, StartBy: req.StartBy})
	x.hashInput()
	env := &envelope.Envelope{ExecutionID: req.ExecutionID, CapabilityID: req.CapabilityID, Status: envelope.StatusFailed,
		Error: cerr.Wire()}
	done, _, _ := x.endUnrun(env, "")
	return done
}

// EndRefused ends req, which has no record, with cerr, refused before it
// ran for reason (on the trail, as a worker's refusal): EndUnrun with a
// reason.
func (r *Runner) EndRefused(req *envelope.Request, principal string, cerr *envelope.CapabilityError, reason string) bool {
	x := newExecution(r.w, req, principal, Delivery{ID: req.ExecutionID, StartBy: req.StartBy})
	x.hashInput()
	env := &envelope.Envelope{ExecutionID: req.ExecutionID, CapabilityID: req.CapabilityID, Status: envelope.StatusFailed,
		Error: cerr.Wire()}
	done, _, _ := x.endUnrun(env, reason)
	return done
}

// EndUndecodable ends a stored message of principal's that is no request
// (the sweeper's; a worker given one terminates it, undecodable): when its
// message id names one of principal's executions, that execution ends
// INPUT_INVALID, as a worker ends it, unless something ended it first. It
// reports whether the message may go: ended, naming no execution, or
// naming one that another request decides. False: the store did not answer.
func (r *Runner) EndUndecodable(principal, capID, msgID string, derr error) bool {
	id := broker.ExecutionOfMsgID(msgID, principal)
	r.w.log.Warn("stored message does not decode: ended and removed", "principal", principal, "executionId", id, "err", derr)
	if envelope.ValidExecutionID(id) != nil {
		return true
	}
	switch r.Envelope(principal, id) {
	case EnvelopePresent, EnvelopeUndecodable:
		return true
	case EnvelopeUnknown:
		return false
	}
	req := &envelope.Request{ExecutionID: id, CapabilityID: capID}
	x := newExecution(r.w, req, principal, Delivery{ID: id})
	env := &envelope.Envelope{ExecutionID: id, CapabilityID: capID, Status: envelope.StatusFailed,
		Error: inputInvalid("The request could not be decoded.").Wire()}
	done, found, _ := x.endUnrun(env, "undecodable")
	return done || found != nil
}

// RestoreEnvelope writes the envelope rec, a finalized record, stands for,
// and reports whether it exists (execution.endRecorded).
func (r *Runner) RestoreEnvelope(req *envelope.Request, principal string, rec *Record) bool {
	x := newExecution(r.w, req, principal, Delivery{ID: req.ExecutionID, StartBy: req.StartBy})
	x.hashInput()
	return x.endRecorded(rec)
}

// EndTaken takes rec, at revision rev, another claim's whose lease ran out,
// by compare-and-swap, as a takeover does, and ends it with cerr, reporting
// attempts; it reports whether the envelope was written. A lost swap means
// someone else moved: nothing is written.
func (r *Runner) EndTaken(ctx context.Context, req *envelope.Request, principal string, rec *Record, rev uint64,
	cerr *envelope.CapabilityError, attempts int) bool {
	x := newExecution(r.w, req, principal, Delivery{ID: req.ExecutionID, StartBy: req.StartBy})
	x.ctx, x.cancel = context.WithCancelCause(ctx)
	defer x.cancel(nil)
	x.hashInput()
	prev := rec.Worker
	x.claim.hold(rec, rev)
	if err := x.claim.update(func(taken *Record) {
		taken.Worker, taken.Claim, taken.LeaseUntil = r.w.cfg.ID, x.claim.token, r.w.now().UTC().Add(r.w.cfg.Lease)
	}); err != nil && !errors.Is(err, errCancelRequested) {
		return false
	}
	switch {
	case rec.State == StatePending:
		x.emit(audit.EventRequested, nil)
	case prev == "":
		// Left waiting for a limit: ended, not taken over from a worker.
	default:
		x.emit(audit.EventTakenOver, map[string]any{"fromWorker": prev, "state": string(rec.State), "attempt": attempts})
	}
	return x.endSwept(unrun(cerr), attempts)
}
