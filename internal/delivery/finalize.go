package delivery

import (
	"errors"
	"time"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/broker"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/observe"
)

// outcome is a terminal result before it becomes the envelope.
type outcome struct {
	env   *envelope.Envelope
	event string
	data  map[string]any
	cause error // private, for the logs
}

func (x *Execution) completed(out envelope.Raw) *outcome {
	return &outcome{env: &envelope.Envelope{Status: envelope.StatusCompleted, Output: out}, event: audit.Completed}
}

func (x *Execution) failed(cerr *envelope.CapabilityError) *outcome {
	return x.failure(cerr, false)
}

// failedAfterRun is a failure after the handler was called: its effect may
// have happened.
func (x *Execution) failedAfterRun(cerr *envelope.CapabilityError) *outcome {
	return x.failure(cerr, true)
}

func (x *Execution) failure(cerr *envelope.CapabilityError, executed bool) *outcome {
	return &outcome{
		env:   &envelope.Envelope{Status: envelope.StatusFailed, Error: cerr.Wire()},
		event: audit.Failed,
		data: map[string]any{"code": string(cerr.Code), "stage": cerr.Stage, "retryable": cerr.Retryable,
			"executedBeforeFailure": executed},
		cause: cerr.Cause,
	}
}

// approvalRequired ends a call that waits for a human decision; its
// terminal event is capability.approval_requested.
func (x *Execution) approvalRequired(ref *envelope.ApprovalRef, data map[string]any) *outcome {
	return &outcome{
		env:   &envelope.Envelope{Status: envelope.StatusApprovalRequired, Approval: ref},
		event: audit.ApprovalRequested,
		data:  data,
	}
}

func (x *Execution) cancelled(code envelope.Code, msg string) *outcome {
	return x.stopped(&envelope.CapabilityError{Code: code, Stage: envelope.StageCancelation, ExposeToModel: true, Message: msg})
}

// stopped is the outcome of an execution the runtime stopped rather than one
// that failed on its own: the caller's cancel or deadline (CANCELLED), or a
// last attempt that timed out (TIMEOUT). Status cancelled, event
// capability.cancelled, its code telling the two apart.
func (x *Execution) stopped(cerr *envelope.CapabilityError) *outcome {
	return &outcome{
		env:   &envelope.Envelope{Status: envelope.StatusCancelled, Error: cerr.Wire()},
		event: audit.Cancelled,
		data:  map[string]any{"code": string(cerr.Code), "stage": cerr.Stage, "retryable": cerr.Retryable},
	}
}

// finalize is stage 14: the terminal event, the one envelope (create-only:
// a second finalization is refused by the server and audited), the record,
// then the ack.
//
// Before anything, unless the lease this worker last wrote still has more
// than half its length to run (no other worker may take over a live lease),
// a CAS on the record renews the lease: it proves the execution is still this
// worker's and keeps it so while the envelope is written. A worker that lost
// it discards its outcome (audited); the new owner finalizes. The create-only
// envelope covers a worker stalled for longer than a lease between the CAS
// and the write.
func (x *Execution) finalize(o *outcome, attempts int) {
	w := x.w
	var err error
	if x.claim.held() == nil {
		// Refused before its claim (stages 4 to 9 of the short path): its
		// record, finalized, comes first, so that a later delivery finds it.
		rec := x.newRecord(StateFinalized)
		rec.Status, rec.LeaseUntil = o.env.Status, time.Time{}
		if o.env.Error != nil {
			rec.LastError = o.env.Error.Code
		}
		if o.cause != nil {
			rec.Cause = o.cause.Error()
		}
		if !x.create(rec) {
			x.yieldClaim()
			return
		}
	} else if o.cause != nil || x.claim.record().LeaseUntil.Sub(x.w.now()) <= w.cfg.Lease/2 {
		// A failure's private cause is kept on the record for operators
		// (capstan status), written with the lease's renewal: the record is
		// not written after the envelope.
		err = x.claim.update(func(r *Record) {
			r.LeaseUntil = x.w.now().UTC().Add(w.cfg.Lease)
			if o.cause != nil {
				r.Cause = o.cause.Error()
			}
		})
	}
	if errors.Is(err, errLost) {
		w.conflicts.Add(1)
		owner := x.claim.record().Worker
		w.log.Warn("claim lost before finalizing: outcome discarded", "executionId", x.req.ExecutionID,
			"owner", owner, "status", o.env.Status)
		x.emit(audit.EnvelopeConflict, map[string]any{"reason": "claim-lost", "owner": owner,
			"discardedStatus": string(o.env.Status), "discardedAttempts": attempts})
		return
	}
	now := x.w.now().UTC()
	env := o.env
	env.V = envelope.Version
	env.ExecutionID = x.req.ExecutionID
	env.CapabilityID = x.req.CapabilityID
	env.Attempts = attempts
	env.DurationMs = x.w.now().Sub(x.start).Milliseconds()
	env.FinalizedBy = w.cfg.ID
	env.FinalizedAt = now

	data := o.data
	if data == nil {
		data = map[string]any{}
	}
	data["attempts"] = attempts
	data["durationMs"] = env.DurationMs
	x.emit(o.event, data)
	if o.cause != nil {
		w.log.Warn("execution failed", "executionId", x.req.ExecutionID, "capabilityId", x.req.CapabilityID,
			"code", env.Error.Code, "cause", o.cause)
	}

	x.trail.flush()
	endStage := x.stage(observe.StageFinalize)
	stored, ok := x.createEnvelope(env)
	if !ok {
		endStage(errors.New("envelope not written"))
		return
	}
	if stored != nil {
		// The envelope is the proof: the record is not rewritten after it
		// (DESIGN §14).
		if ours := stored.FinalizedBy == env.FinalizedBy && stored.FinalizedAt.Equal(env.FinalizedAt); ours {
			x.obs.Finalized(stored)
			w.log.Info("execution finalized", "executionId", env.ExecutionID, "capabilityId", env.CapabilityID,
				"status", env.Status, "code", errorCode(env), "attempts", env.Attempts, "durationMs", env.DurationMs)
		}
	}
	endStage(nil)
	// A lost ack is a redelivery, which finds the envelope: no need to wait.
	_ = x.msg.Ack()
}

// errorCode is the envelope's error code, "" when it has none.
func errorCode(env *envelope.Envelope) envelope.Code {
	if env.Error == nil {
		return ""
	}
	return env.Error.Code
}

// createEnvelope writes the envelope once. It reports whether the message may
// be acknowledged (an envelope, ours or another's, exists) and returns the
// stored envelope.
func (x *Execution) createEnvelope(env *envelope.Envelope) (*envelope.Envelope, bool) {
	w := x.w
	start := x.w.now()
	for try := 0; ; try++ {
		err := w.store.createEnvelope(x.key, env)
		if err == nil {
			w.finalized.Add(1)
			return env, true
		}
		if errors.Is(err, broker.ErrExists) {
			have, lerr := x.w.store.storedEnvelope(x.key)
			if lerr != nil {
				// Not found: a replicated bucket can refuse a create
				// spuriously. Unreadable: unknown is not present. Either way,
				// acknowledging now could lose the execution.
				if w.store.givesUp(start, try) {
					w.log.Error("envelope refused but not readable", "executionId", x.req.ExecutionID, "err", lerr)
					return nil, false
				}
				time.Sleep(broker.Backoff(try))
				continue
			}
			if have.FinalizedBy == env.FinalizedBy && have.FinalizedAt.Equal(env.FinalizedAt) {
				w.finalized.Add(1) // our own write, whose answer was lost
				return have, true
			}
			w.conflicts.Add(1)
			x.emit(audit.EnvelopeConflict, map[string]any{"reason": "envelope-exists", "discardedStatus": string(env.Status),
				"discardedAttempts": env.Attempts, "finalizedBy": have.FinalizedBy, "status": string(have.Status)})
			return have, true
		}
		if w.store.givesUp(start, try) {
			// Leave the message unacknowledged: its redelivery decides again.
			w.log.Error("envelope not written", "executionId", x.req.ExecutionID, "err", err)
			return nil, false
		}
		time.Sleep(broker.Backoff(try))
	}
}

// storedEnvelope reads the envelope a create was refused for. An absence is
// confirmed with the stream's leader: a replica catching up after a restart
// may not have the envelope yet.
func (x *Execution) storedEnvelope() (*envelope.Envelope, error) {
	var err error
	for try := 0; try < 5; try++ {
		ctx, cancel := StoreContext()
		var have *envelope.Envelope
		have, _, err = broker.Load[envelope.Envelope](ctx, x.w.b.Envelopes, x.key)
		if errors.Is(err, broker.ErrNotFound) {
			have, _, err = broker.LoadFromLeader[envelope.Envelope](ctx, x.w.nc, x.w.b.Envelopes, x.key)
		}
		cancel()
		if err == nil {
			return have, nil
		}
		if errors.Is(err, broker.ErrNotFound) {
			return nil, err
		}
		time.Sleep(broker.Backoff(try))
	}
	return nil, err
}
