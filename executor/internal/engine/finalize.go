package engine

import (
	"context"
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

func completed(out envelope.Raw) *outcome {
	return &outcome{env: &envelope.Envelope{Status: envelope.StatusCompleted, Output: out}, event: audit.EventCompleted}
}

func failed(cerr *envelope.CapabilityError) *outcome {
	return failure(cerr, false)
}

// failedAfterRun is a failure after the handler was called: its effect may
// have happened.
func failedAfterRun(cerr *envelope.CapabilityError) *outcome {
	return failure(cerr, true)
}

func failure(cerr *envelope.CapabilityError, executed bool) *outcome {
	return &outcome{
		env:   &envelope.Envelope{Status: envelope.StatusFailed, Error: cerr.Wire()},
		event: audit.EventFailed,
		data: map[string]any{"code": string(cerr.Code), "stage": cerr.Stage, "retryable": cerr.Retryable,
			"executedBeforeFailure": executed},
		cause: cerr.Cause,
	}
}

// approvalRequired ends a call that waits for a human decision; its
// terminal event is capability.approval_requested.
func approvalRequired(ref *envelope.ApprovalRef, data map[string]any) *outcome {
	return &outcome{
		env:   &envelope.Envelope{Status: envelope.StatusApprovalRequired, Approval: ref},
		event: audit.EventApprovalRequested,
		data:  data,
	}
}

func cancelled(code envelope.Code, msg string) *outcome {
	return stopped(&envelope.CapabilityError{Code: code, Stage: envelope.StageCancelation, ExposeToModel: true, Message: msg})
}

// stopped is the outcome of an execution the runtime stopped rather than one
// that failed on its own: the caller's cancel or deadline (CANCELLED), or a
// last attempt that timed out (TIMEOUT). Status cancelled, event
// capability.cancelled, its code telling the two apart.
func stopped(cerr *envelope.CapabilityError) *outcome {
	return &outcome{
		env:   &envelope.Envelope{Status: envelope.StatusCancelled, Error: cerr.Wire()},
		event: audit.EventCancelled,
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
func (e *Execution) finalize(o *outcome, attempts int) {
	var err error
	if e.claim.held() == nil {
		// Refused before its claim (stages 4 to 9 of the short path): its
		// record, finalized, comes first, so that a later delivery finds it.
		rec := e.newRecord(StateFinalized)
		rec.Status, rec.LeaseUntil = o.env.Status, time.Time{}
		if o.env.Error != nil {
			rec.LastError = o.env.Error.Code
		}
		if o.cause != nil {
			rec.Cause = o.cause.Error()
		}
		if !e.create(rec) {
			e.yieldClaim()
			return
		}
	} else if o.cause != nil || renewBeforeEnvelope(e.claim.record().LeaseUntil, e.r.now(), e.r.cfg.Lease) {
		// A failure's private cause is kept on the record for operators
		// (capstan status), written with the lease's renewal: the record is
		// not written after the envelope.
		err = e.claim.update(func(r *Record) {
			r.LeaseUntil = e.r.now().UTC().Add(e.r.cfg.Lease)
			if o.cause != nil {
				r.Cause = o.cause.Error()
			}
		})
	}
	if errors.Is(err, errLost) {
		e.r.conflicts.Add(1)
		owner := e.claim.record().Worker
		e.r.log.Warn("claim lost before finalizing: outcome discarded", "executionId", e.req.ExecutionID,
			"owner", owner, "status", o.env.Status)
		e.emit(audit.EventEnvelopeConflict, map[string]any{"reason": "claim-lost", "owner": owner,
			"discardedStatus": string(o.env.Status), "discardedAttempts": attempts})
		return
	}
	now := e.r.now().UTC()
	env := o.env
	env.V = envelope.Version
	env.ExecutionID = e.req.ExecutionID
	env.CapabilityID = e.req.CapabilityID
	env.Attempts = attempts
	env.DurationMs = e.r.now().Sub(e.start).Milliseconds()
	env.FinalizedBy = e.r.cfg.ID
	env.FinalizedAt = now

	data := o.data
	if data == nil {
		data = map[string]any{}
	}
	data["attempts"] = attempts
	data["durationMs"] = env.DurationMs
	e.emit(o.event, data)
	if o.cause != nil {
		e.r.log.Warn("execution failed", "executionId", e.req.ExecutionID, "capabilityId", e.req.CapabilityID,
			"code", env.Error.Code, "cause", o.cause)
	}

	e.trail.flush()
	endStage := e.stage(observe.StageFinalize)
	stored, ok := e.createEnvelope(env)
	if !ok {
		endStage(errors.New("envelope not written"))
		return
	}
	if stored != nil {
		// The envelope is the proof: the record is not rewritten after it
		// (DESIGN §14).
		if ours := stored.FinalizedBy == env.FinalizedBy && stored.FinalizedAt.Equal(env.FinalizedAt); ours {
			e.obs.Finalized(stored)
			e.r.log.Info("execution finalized", "executionId", env.ExecutionID, "capabilityId", env.CapabilityID,
				"status", env.Status, "code", errorCode(env), "attempts", env.Attempts, "durationMs", env.DurationMs)
		}
	}
	endStage(nil)
	// A lost ack is a redelivery, which finds the envelope: no need to wait.
	_ = e.msg.Ack()
}

// renewBeforeEnvelope reports whether a finalization renews the lease,
// which runs until leaseUntil, before it writes the envelope at now: when
// less than half the lease is left. No other worker may take over a live
// lease; the renewal proves the execution still this worker's and keeps it
// so while the envelope is written (the create-only envelope covers a
// worker stalled for longer than that).
func renewBeforeEnvelope(leaseUntil, now time.Time, lease time.Duration) bool {
	return leaseUntil.Sub(now) <= lease/2
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
func (e *Execution) createEnvelope(env *envelope.Envelope) (*envelope.Envelope, bool) {
	start := e.r.now()
	for try := 0; ; try++ {
		err := e.r.store.createEnvelope(e.key, env)
		if err == nil {
			e.r.finalized.Add(1)
			return env, true
		}
		if errors.Is(err, broker.ErrExists) {
			have, lerr := e.r.store.storedEnvelope(e.key)
			if lerr != nil {
				// Not found: a replicated bucket can refuse a create
				// spuriously. Unreadable: unknown is not present. Either way,
				// acknowledging now could lose the execution.
				if e.r.store.givesUp(start, try) {
					e.r.log.Error("envelope refused but not readable", "executionId", e.req.ExecutionID, "err", lerr)
					return nil, false
				}
				time.Sleep(broker.Backoff(try))
				continue
			}
			if have.FinalizedBy == env.FinalizedBy && have.FinalizedAt.Equal(env.FinalizedAt) {
				e.r.finalized.Add(1) // our own write, whose answer was lost
				return have, true
			}
			e.r.conflicts.Add(1)
			e.emit(audit.EventEnvelopeConflict, map[string]any{"reason": "envelope-exists", "discardedStatus": string(env.Status),
				"discardedAttempts": env.Attempts, "finalizedBy": have.FinalizedBy, "status": string(have.Status)})
			return have, true
		}
		if e.r.store.givesUp(start, try) {
			// Leave the message unacknowledged: its redelivery decides again.
			e.r.log.Error("envelope not written", "executionId", e.req.ExecutionID, "err", err)
			return nil, false
		}
		time.Sleep(broker.Backoff(try))
	}
}

// NotStartedError is the envelope error of a request no worker started in time.
func NotStartedError() *envelope.CapabilityError {
	return &envelope.CapabilityError{Code: envelope.CodeNotStarted, Stage: envelope.StageQueue, ExposeToModel: true,
		Message: "No worker started the operation before its start deadline; it never ran."}
}

// notStartedEnvelope is the envelope of a request that never started.
func notStartedEnvelope(req *envelope.Request) *envelope.Envelope {
	return &envelope.Envelope{ExecutionID: req.ExecutionID, CapabilityID: req.CapabilityID, Status: envelope.StatusFailed,
		Error: NotStartedError().Wire()}
}

// finalizeRecorded writes the envelope a finalized record stands for and
// that was never written: a record finalized before its envelope (a request
// refused before its claim, one that never started, one that does not
// decode) whose writer was lost between the two writes, or gave up on the
// envelope. The envelope is rebuilt from the record's status and error code.
// It reports whether the envelope exists. A record older than the envelope
// retention is not repaired: its envelope may have been written and expired
// since.
func (r *Runner) finalizeRecorded(e *Execution, rec *Record) bool {
	if rec.State != StateFinalized {
		return false
	}
	if kept := r.envelopeRetention(); kept > 0 && r.now().Sub(rec.UpdatedAt) >= kept {
		return true
	}
	env := recordedEnvelope(e.req, rec)
	env.V, env.FinalizedBy, env.FinalizedAt = envelope.Version, r.cfg.ID, r.now().UTC()
	ctx, cancel := StoreContext()
	defer cancel()
	_, err := broker.Create(ctx, r.b.Envelopes, e.key, env)
	if err == nil {
		if env.Error != nil {
			event := audit.EventFailed
			if env.Status == envelope.StatusCancelled {
				event = audit.EventCancelled
			}
			e.emit(event, map[string]any{"code": string(env.Error.Code), "stage": env.Error.Stage,
				"retryable": env.Error.Retryable, "attempts": rec.Attempt,
				"executedBeforeFailure": env.Error.Code == envelope.CodeOutcomeUnknown})
		}
		r.finalized.Add(1)
		r.observeFinalized(e, env)
	}
	return err == nil || errors.Is(err, broker.ErrExists)
}

// recordedEnvelope is the envelope a finalized record stands for. A record
// keeps the status and the error code, not the message: the message is the
// code's own.
func recordedEnvelope(req *envelope.Request, rec *Record) *envelope.Envelope {
	env := &envelope.Envelope{ExecutionID: req.ExecutionID, CapabilityID: rec.CapabilityID, Status: rec.Status,
		Attempts: rec.Attempt}
	if env.CapabilityID == "" {
		env.CapabilityID = req.CapabilityID
	}
	if env.Status == "" {
		env.Status = envelope.StatusFailed
	}
	switch rec.LastError {
	case "":
	case envelope.CodeNotStarted:
		env.Error = NotStartedError().Wire()
	case envelope.CodeCapabilityNotFound:
		env.Error = NotFoundError().Wire()
	case envelope.CodeOutcomeUnknown:
		env.Error = outcomeUnknown(expiredRecordMessage).Wire()
	default:
		env.Error = &envelope.Error{Code: rec.LastError, Stage: recordedStage(rec.LastError),
			ExposeToModel: rec.LastError != envelope.CodeInternalError && rec.LastError != envelope.CodeExecutionFailed,
			Message:       "The operation was refused before it ran (" + string(rec.LastError) + ")."}
		if rec.Status == envelope.StatusCancelled {
			env.Error.Message = "The operation was stopped before it ran (" + string(rec.LastError) + ")."
		}
	}
	return env
}

// recordedStage is the pipeline stage an error code of a request refused
// before its claim comes from ("" when several may).
func recordedStage(code envelope.Code) string {
	switch code {
	case envelope.CodeInputInvalid:
		return envelope.StageInput
	case envelope.CodeUnauthenticated, envelope.CodeForbidden:
		return envelope.StageActor
	case envelope.CodeApprovalPending, envelope.CodeApprovalRejected, envelope.CodeApprovalExpired,
		envelope.CodeApprovalConsumed, envelope.CodeApprovalInputMismatch, envelope.CodeApprovalSelfApproval,
		envelope.CodeApprovalUnserializableInput:
		return envelope.StageApproval
	case envelope.CodeCancelled:
		return envelope.StageCancelation
	case envelope.CodeOutcomeUnknown:
		return envelope.StageHandler
	}
	return ""
}

// NotFoundError is the one answer for an unknown, unexposed or hidden
// capability: the same bytes whichever it was (SI-8).
func NotFoundError() *envelope.CapabilityError {
	return &envelope.CapabilityError{Code: envelope.CodeCapabilityNotFound, Stage: envelope.StageResolve, ExposeToModel: true,
		Message: "No such capability."}
}

// NotFoundNear is NotFoundError suggesting near, a capability the caller may
// see whose id is near the one it named ("": none). Every path that answers
// CAPABILITY_NOT_FOUND for a request suggests the same, computed from what
// the caller may see alone, so the answer stays the same whether the id
// named exists hidden or not at all (SI-8).
func NotFoundNear(near string) *envelope.CapabilityError {
	cerr := NotFoundError()
	if near != "" {
		cerr.Message = "No such capability. Did you mean " + near + "?"
		cerr.Details = map[string]any{"didYouMean": near}
	}
	return cerr
}

// finalizeWithoutRun writes a finalized record, its trail (requested, denied
// for reason unless it is empty, failed), then the envelope, for a request
// refused before it could run (one that does not decode, one past its start
// deadline). done reports that the envelope exists. If another record
// exists, it owns the id and is returned (found, with its revision); a
// finalized one of the same outcome without its envelope is this path's
// own, interrupted before the envelope. Neither done nor a record: the store
// did not answer.
func (r *Runner) finalizeWithoutRun(e *Execution, env *envelope.Envelope, reason string) (done bool, found *Record, foundRev uint64) {
	id, capID := e.req.ExecutionID, e.req.CapabilityID
	ctx, cancel := StoreContext()
	defer cancel()
	rec := r.finalizedRecord(id, capID, env.Status, env.Error.Code)
	if _, err := r.b.Create(ctx, r.b.Executions, e.key, rec, r.b.Config.RecordWindow); err != nil {
		rec, rev, lerr := broker.Load[Record](ctx, r.b.Executions, e.key)
		if lerr != nil {
			return false, nil, 0
		}
		if rec.State != StateFinalized || rec.CapabilityID != capID || rec.Status != env.Status ||
			rec.LastError != env.Error.Code {
			return false, rec, rev
		}
	}
	e.emit(audit.EventRequested, nil)
	if reason != "" {
		e.emit(audit.EventDenied, map[string]any{"reason": reason, "publicCode": string(env.Error.Code), "stage": env.Error.Stage})
	}
	// Only an attempt that may have run under an expired record ends here
	// OUTCOME_UNKNOWN (the sweeper's).
	e.emit(audit.EventFailed, map[string]any{"code": string(env.Error.Code), "stage": env.Error.Stage,
		"retryable": false, "attempts": 0, "executedBeforeFailure": env.Error.Code == envelope.CodeOutcomeUnknown})
	env.V = envelope.Version
	env.FinalizedBy = r.cfg.ID
	env.FinalizedAt = r.now().UTC()
	_, err := r.b.Create(ctx, r.b.Envelopes, e.key, env, 0)
	if err == nil {
		r.finalized.Add(1)
		r.observeFinalized(e, env)
	}
	return err == nil || errors.Is(err, broker.ErrExists), nil, 0
}

// observeFinalized tells the observer and the log of an envelope written
// outside the pipeline (finalizeWithoutRun, finalizeRecorded), as finalize
// does of the others: through the delivery's observer when it has one,
// otherwise as an execution of its own that ends with the envelope, so that
// every envelope this worker creates is counted and logged once.
func (r *Runner) observeFinalized(e *Execution, env *envelope.Envelope) {
	if e.obs != nil {
		e.obs.Finalized(env)
	} else {
		_, obs := r.cfg.Observer.Begin(r.base, r.observed(e.delivery, e.req, r.cfg.Capabilities[e.req.CapabilityID] != nil))
		obs.Finalized(env)
		obs.End()
	}
	r.log.Info("execution finalized", "executionId", env.ExecutionID, "capabilityId", env.CapabilityID,
		"status", env.Status, "code", errorCode(env), "attempts", env.Attempts, "durationMs", env.DurationMs)
}

// finalizedRecord is the record written when a request is finalized without
// running (undecodable): it keeps the invariant that an envelope is always
// preceded by its execution's record.
// code, kept as LastError, says which envelope the record stands for.
func (r *Runner) finalizedRecord(id, capID string, status envelope.Status, code envelope.Code) *Record {
	now := r.now().UTC()
	return &Record{V: envelope.Version, ExecutionID: id, CapabilityID: capID, State: StateFinalized,
		Worker: r.cfg.ID, Status: status, LastError: code, CreatedAt: now, UpdatedAt: now}
}

// Ending an execution no delivery carries: what the sweeper (package
// sweeper) asks of the engine for a request past its deadline, once its own
// table (DESIGN §13) has decided. The engine writes, as it does for a
// delivery: the record by compare-and-swap, the trail, the one envelope.

// Record reads principal's execution id's record and its revision.
func (r *Runner) Record(principal, id string) (*Record, uint64, error) {
	ctx, cancel := StoreContext()
	defer cancel()
	return broker.Load[Record](ctx, r.b.Executions, broker.Key(principal, id))
}

// Envelope reads what is stored of principal's execution id's envelope.
func (r *Runner) Envelope(principal, id string) EnvelopeRead {
	return classifyEnvelope(r.store.envelope(broker.Key(principal, id)))
}

// EndUnrun ends req, which has no record, with cerr and reports whether its
// envelope exists: a finalized record (create-only, so that no worker claims
// it meanwhile), the trail, then the envelope (finalizeWithoutRun).
func (r *Runner) EndUnrun(req *envelope.Request, principal string, cerr *envelope.CapabilityError) bool {
	e := r.bare(nil, req, principal)
	e.hashInput()
	env := &envelope.Envelope{ExecutionID: req.ExecutionID, CapabilityID: req.CapabilityID, Status: envelope.StatusFailed,
		Error: cerr.Wire()}
	done, _, _ := r.finalizeWithoutRun(e, env, "")
	return done
}

// EndRefused ends req, which has no record, with cerr, refused before it
// ran for reason (on the trail, as a worker's refusal): EndUnrun with a
// reason.
func (r *Runner) EndRefused(req *envelope.Request, principal string, cerr *envelope.CapabilityError, reason string) bool {
	e := r.bare(nil, req, principal)
	e.hashInput()
	env := &envelope.Envelope{ExecutionID: req.ExecutionID, CapabilityID: req.CapabilityID, Status: envelope.StatusFailed,
		Error: cerr.Wire()}
	done, _, _ := r.finalizeWithoutRun(e, env, reason)
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
	r.log.Warn("stored message does not decode: ended and removed", "principal", principal, "executionId", id, "err", derr)
	if envelope.ValidExecutionID(id) != nil {
		return true
	}
	switch r.Envelope(principal, id) {
	case EnvelopePresent, EnvelopeUndecodable:
		return true
	case EnvelopeUnknown:
		return false
	}
	e := r.bare(nil, &envelope.Request{ExecutionID: id, CapabilityID: capID}, principal)
	done, found, _ := r.finalizeWithoutRun(e, inputInvalid(id, capID, "The request could not be decoded."), "undecodable")
	return done || found != nil
}

// RestoreEnvelope writes the envelope rec, a finalized record, stands for,
// and reports whether it exists (finalizeRecorded).
func (r *Runner) RestoreEnvelope(req *envelope.Request, principal string, rec *Record) bool {
	e := r.bare(nil, req, principal)
	e.hashInput()
	return r.finalizeRecorded(e, rec)
}

// EndTaken takes rec, at revision rev, another claim's whose lease ran out,
// by compare-and-swap, as a takeover does, and ends it as a says (Cancel,
// NotStarted or Fail); it reports whether the envelope was written. A lost
// swap means someone else moved: nothing is written.
func (r *Runner) EndTaken(ctx context.Context, req *envelope.Request, principal string, rec *Record, rev uint64, a Action) bool {
	e := r.bare(nil, req, principal)
	e.ctx, e.cancel = context.WithCancelCause(ctx)
	defer e.cancel(nil)
	e.hashInput()
	var o *outcome
	switch a.Do {
	case Cancel:
		o = cancelled(envelope.CodeCancelled, "The caller cancelled the execution.")
	case NotStarted:
		o = failed(NotStartedError())
	case Fail:
		o = afterRun(a.Err)
	default:
		return false
	}
	prev := rec.Worker
	e.claim.hold(rec, rev)
	if err := e.claim.update(func(taken *Record) {
		taken.Worker, taken.Claim, taken.LeaseUntil = r.cfg.ID, e.claim.token, r.now().UTC().Add(r.cfg.Lease)
	}); err != nil && !errors.Is(err, errCancelRequested) {
		return false
	}
	switch {
	case rec.State == StatePending:
		e.emit(audit.EventRequested, nil)
	case prev == "":
		// Left waiting for a limit: ended, not taken over from a worker.
	default:
		e.emit(audit.EventTakenOver, map[string]any{"fromWorker": prev, "state": string(rec.State), "attempt": a.Attempts})
	}
	return e.finalizeSwept(o, a.Attempts)
}

// finalizeSwept is finalize without a delivery to acknowledge.
func (e *Execution) finalizeSwept(o *outcome, attempts int) bool {
	env := o.env
	env.V, env.ExecutionID, env.CapabilityID = envelope.Version, e.req.ExecutionID, e.req.CapabilityID
	env.Attempts, env.FinalizedBy, env.FinalizedAt = attempts, e.r.cfg.ID, e.r.now().UTC()
	data := o.data
	if data == nil {
		data = map[string]any{}
	}
	data["attempts"] = attempts
	e.emit(o.event, data)
	stored, ok := e.createEnvelope(env)
	if !ok {
		return false
	}
	_ = e.claim.update(func(r *Record) {
		r.State, r.Status, r.Attempt = StateFinalized, stored.Status, stored.Attempts
		if stored.Error != nil {
			r.LastError = stored.Error.Code
		}
	})
	return true
}
