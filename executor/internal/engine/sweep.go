package engine

import (
	"context"
	"errors"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/broker"
	"github.com/capstan-dev/capstan/envelope"
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
	x := r.w.execution(req, principal, Delivery{ID: req.ExecutionID, StartBy: req.StartBy})
	x.hashInput()
	env := &envelope.Envelope{ExecutionID: req.ExecutionID, CapabilityID: req.CapabilityID, Status: envelope.StatusFailed,
		Error: cerr.Wire()}
	done, _, _ := x.endUnrun(env, "")
	return done
}

// RestoreEnvelope writes the envelope rec, a finalized record, stands for,
// and reports whether it exists (execution.endRecorded).
func (r *Runner) RestoreEnvelope(req *envelope.Request, principal string, rec *Record) bool {
	x := r.w.execution(req, principal, Delivery{ID: req.ExecutionID, StartBy: req.StartBy})
	x.hashInput()
	return x.endRecorded(rec)
}

// EndTaken takes rec, at revision rev, another claim's whose lease ran out,
// by compare-and-swap, as a takeover does, and ends it with cerr, reporting
// attempts; it reports whether the envelope was written. A lost swap means
// someone else moved: nothing is written.
func (r *Runner) EndTaken(ctx context.Context, req *envelope.Request, principal string, rec *Record, rev uint64,
	cerr *envelope.CapabilityError, attempts int) bool {
	x := r.w.execution(req, principal, Delivery{ID: req.ExecutionID, StartBy: req.StartBy})
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
