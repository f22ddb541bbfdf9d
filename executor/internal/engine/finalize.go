package engine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"time"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/msgenc"
	"github.com/capstan-dev/capstan/observe"
)

// outcome is a terminal result before it becomes the envelope.
type outcome struct {
	env   *envelope.Envelope
	event string
	data  map[string]any
	cause error // private, for the logs
	// completion holds a completed call's envelope (env), made with the
	// outcome: one allocation.
	completion envelope.Envelope
}

func completed(out envelope.Raw) *outcome {
	o := &outcome{event: audit.EventCompleted, completion: envelope.Envelope{Status: envelope.StatusCompleted, Output: out}}
	o.env = &o.completion
	return o
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

// end is stage 14 but the ack (delivery.finalize): the terminal event, the one envelope
// (create-only: a second finalization is refused by the server and
// audited), the record. It reports whether the delivery may be
// acknowledged (an envelope exists), and returns what follows: nothing,
// unless the record an unclaimed execution's finalization creates finds
// another in its way (then the takeover table decides from that one).
//
// Before anything, unless the lease this worker last wrote still has more
// than half its length to run (no other worker may take over a live lease),
// a CAS on the record renews the lease: it proves the execution is still this
// worker's and keeps it so while the envelope is written. A worker that lost
// it discards its outcome (audited); the new owner finalizes. The create-only
// envelope covers a worker stalled for longer than a lease between the CAS
// and the write.
func (x *execution) end(o *outcome, attempts int) (Action, bool) {
	x.audited()
	var err error
	switch {
	case x.unclaimed:
		// A read without a claim: its envelope alone (DESIGN §14).
	case x.claim.held() == nil:
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
			return x.yield(), false
		}
	case o.cause != nil || renewBeforeEnvelope(x.claim.record().LeaseUntil, x.w.now(), x.w.cfg.Lease):
		// A failure's private cause is kept on the record for operators
		// (capstan status), written with the lease's renewal: the record is
		// not written after the envelope.
		err = x.claim.update(func(r *Record) {
			r.LeaseUntil = x.w.now().UTC().Add(x.w.cfg.Lease)
			if o.cause != nil {
				r.Cause = o.cause.Error()
			}
		})
	}
	if errors.Is(err, errLost) {
		x.w.stats.conflicts.Add(1)
		owner := x.claim.record().Worker
		x.w.log.Warn("claim lost before finalizing: outcome discarded", "executionId", x.req.ExecutionID,
			"owner", owner, "status", o.env.Status)
		x.emit(audit.EventEnvelopeConflict, map[string]any{"reason": "claim-lost", "owner": owner,
			"discardedStatus": string(o.env.Status), "discardedAttempts": attempts})
		return Action{}, false
	}
	now := x.w.now().UTC()
	env := o.env
	env.V = envelope.Version
	env.ExecutionID = x.req.ExecutionID
	env.CapabilityID = x.req.CapabilityID
	env.Attempts = attempts
	env.DurationMs = x.w.now().Sub(x.start).Milliseconds()
	env.FinalizedBy = x.w.cfg.ID
	env.FinalizedAt = now

	data := o.data
	if data == nil {
		data = map[string]any{}
	}
	data["attempts"] = attempts
	data["durationMs"] = env.DurationMs
	sealed := seal(env, data)
	defer sealed.Release()
	x.emit(o.event, data)
	if o.cause != nil {
		x.w.log.Warn("execution failed", "executionId", x.req.ExecutionID, "capabilityId", x.req.CapabilityID,
			"code", env.Error.Code, "cause", o.cause)
	}

	x.trail.flush()
	endStage := x.stage(observe.StageFinalize)
	stored, ok := x.createEnvelope(env, sealed)
	if !ok {
		endStage(errors.New("envelope not written"))
		return Action{}, false
	}
	if stored != nil {
		// The envelope is the proof: the record is not rewritten after it
		// (DESIGN §14).
		if ours := stored.FinalizedBy == env.FinalizedBy && stored.FinalizedAt.Equal(env.FinalizedAt); ours {
			x.obs.Finalized(stored)
			x.w.logFinalized(env)
		}
	}
	endStage(nil)
	return Action{}, true
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

// EnvelopeHashKey is the data field of an execution's terminal event
// (completed, failed, cancelled, approval_requested) that commits to its
// envelope: the hex SHA-256 of the envelope's bytes as the envelopes bucket
// stores them, so that the envelope is proved through the trail's log
// (DESIGN §8, "The trail as a log").
const EnvelopeHashKey = "envelopeHash"

// sealed is an envelope encoded once: the bytes the envelopes bucket
// stores, of which the terminal event holds the hash.
type sealed struct {
	enc msgenc.Encoded
	ok  bool
}

// seal encodes env once, for the envelopes bucket, and puts the hash of
// those bytes in the terminal event's data. Release the encoding once the
// envelope is written.
func seal(env *envelope.Envelope, data map[string]any) sealed {
	enc, err := msgenc.Encode(env)
	if err != nil {
		// Not an envelope the bucket could store either: the create
		// encodes it again and reports it.
		return sealed{}
	}
	sum := sha256.Sum256(enc.Bytes())
	var hexSum [2 * sha256.Size]byte
	hex.Encode(hexSum[:], sum[:])
	data[EnvelopeHashKey] = string(hexSum[:]) // the one allocation of the hash's text

	return sealed{enc: enc, ok: true}
}

// Release hands the encoding's buffer back.
func (s sealed) Release() {
	if s.ok {
		s.enc.Release()
	}
}

// createEnvelope writes the envelope once, as sealed holds it (env encoded
// again when it holds nothing). It reports whether the message may be
// acknowledged (an envelope, ours or another's, exists) and returns the
// stored envelope.
func (x *execution) createEnvelope(env *envelope.Envelope, sealed sealed) (*envelope.Envelope, bool) {
	start := x.w.now()
	for try := 0; ; try++ {
		err := x.w.store.createEnvelope(x.key, env, sealed)
		if err == nil {
			x.w.stats.finalized.Add(1)
			return env, true
		}
		if errors.Is(err, broker.ErrExists) {
			have, lerr := x.w.store.storedEnvelope(x.key)
			if lerr != nil {
				// Not found: a replicated bucket can refuse a create
				// spuriously. Unreadable: unknown is not present. Either way,
				// acknowledging now could lose the execution.
				if x.w.store.givesUp(start, try) {
					x.w.log.Error("envelope refused but not readable", "executionId", x.req.ExecutionID, "err", lerr)
					return nil, false
				}
				time.Sleep(broker.Backoff(try))
				continue
			}
			if have.FinalizedBy == env.FinalizedBy && have.FinalizedAt.Equal(env.FinalizedAt) {
				x.w.stats.finalized.Add(1) // our own write, whose answer was lost
				return have, true
			}
			x.w.stats.conflicts.Add(1)
			x.emit(audit.EventEnvelopeConflict, map[string]any{"reason": "envelope-exists", "discardedStatus": string(env.Status),
				"discardedAttempts": env.Attempts, "finalizedBy": have.FinalizedBy, "status": string(have.Status)})
			return have, true
		}
		if x.w.store.givesUp(start, try) {
			// Leave the message unacknowledged: its redelivery decides again.
			x.w.log.Error("envelope not written", "executionId", x.req.ExecutionID, "err", err)
			return nil, false
		}
		time.Sleep(broker.Backoff(try))
	}
}

// unrun is the outcome of an execution ended with cerr by a worker that did
// not run it: stopped for a cancel; otherwise a failure, after which its
// effect may have happened only when its outcome is unknown.
func unrun(cerr *envelope.CapabilityError) *outcome {
	if cerr.Stage == envelope.StageCancelation {
		return stopped(cerr)
	}
	return failure(cerr, cerr.Code == envelope.CodeOutcomeUnknown)
}

// CancelledError is the error of an execution its caller cancelled.
func CancelledError() *envelope.CapabilityError {
	return &envelope.CapabilityError{Code: envelope.CodeCancelled, Stage: envelope.StageCancelation, ExposeToModel: true,
		Message: "The caller cancelled the execution."}
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

// endRecorded writes the envelope a finalized record stands for and
// that was never written: a record finalized before its envelope (a request
// refused before its claim, one that never started, one that does not
// decode) whose writer was lost between the two writes, or gave up on the
// envelope. The envelope is rebuilt from the record's status and error code.
// It reports whether the envelope exists. A record older than the envelope
// retention is not repaired: its envelope may have been written and expired
// since.
func (x *execution) endRecorded(rec *Record) bool {
	w := x.w
	if rec.State != StateFinalized {
		return false
	}
	if kept := w.envelopeRetention(); kept > 0 && w.now().Sub(rec.UpdatedAt) >= kept {
		return true
	}
	env := recordedEnvelope(x.req, rec)
	env.V, env.FinalizedBy, env.FinalizedAt = envelope.Version, w.cfg.ID, w.now().UTC()
	ctx, cancel := StoreContext()
	defer cancel()
	data := map[string]any{}
	sealed := seal(env, data)
	defer sealed.Release()
	_, err := w.store.createEnvelopeIn(ctx, x.key, env, sealed)
	if err == nil {
		if env.Error != nil {
			event := audit.EventFailed
			if env.Status == envelope.StatusCancelled {
				event = audit.EventCancelled
			}
			data["code"], data["stage"], data["retryable"], data["attempts"] = string(env.Error.Code), env.Error.Stage,
				env.Error.Retryable, rec.Attempt
			data["executedBeforeFailure"] = env.Error.Code == envelope.CodeOutcomeUnknown
			x.emit(event, data)
		}
		w.stats.finalized.Add(1)
		x.observeFinalized(env)
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

// inputInvalid is the error of a request refused as no request at all.
func inputInvalid(message string) *envelope.CapabilityError {
	return &envelope.CapabilityError{Code: envelope.CodeInputInvalid, Stage: envelope.StageInput, Message: message, ExposeToModel: true}
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

// endUnrun writes a finalized record, its trail (requested, denied
// for reason unless it is empty, failed), then the envelope, for a request
// refused before it could run (one that does not decode, one past its start
// deadline). done reports that the envelope exists. If another record
// exists, it owns the id and is returned (found, with its revision); a
// finalized one of the same outcome without its envelope is this path's
// own, interrupted before the envelope. Neither done nor a record: the store
// did not answer.
func (x *execution) endUnrun(env *envelope.Envelope, reason string) (done bool, found *Record, foundRev uint64) {
	w := x.w
	id, capID := x.req.ExecutionID, x.req.CapabilityID
	ctx, cancel := StoreContext()
	defer cancel()
	rec := w.finalizedRecord(id, capID, env.Status, env.Error.Code)
	if _, err := w.b.Create(ctx, w.b.Executions, x.key, rec, w.b.Config.RecordWindow); err != nil {
		rec, rev, lerr := broker.Load[Record](ctx, w.b.Executions, x.key)
		if lerr != nil {
			return false, nil, 0
		}
		if rec.State != StateFinalized || rec.CapabilityID != capID || rec.Status != env.Status ||
			rec.LastError != env.Error.Code {
			return false, rec, rev
		}
	}
	env.V = envelope.Version
	env.FinalizedBy = w.cfg.ID
	env.FinalizedAt = w.now().UTC()
	x.emit(audit.EventRequested, nil)
	if reason != "" {
		x.emit(audit.EventDenied, map[string]any{"reason": reason, "publicCode": string(env.Error.Code), "stage": env.Error.Stage})
	}
	// Only an attempt that may have run under an expired record ends here
	// OUTCOME_UNKNOWN (the sweeper's).
	data := map[string]any{"code": string(env.Error.Code), "stage": env.Error.Stage,
		"retryable": false, "attempts": 0, "executedBeforeFailure": env.Error.Code == envelope.CodeOutcomeUnknown}
	sealed := seal(env, data)
	defer sealed.Release()
	x.emit(audit.EventFailed, data)
	_, err := w.store.createEnvelopeIn(ctx, x.key, env, sealed)
	if err == nil {
		w.stats.finalized.Add(1)
		x.observeFinalized(env)
	}
	return err == nil || errors.Is(err, broker.ErrExists), nil, 0
}

// observeFinalized tells the observer and the log of an envelope written
// outside the pipeline (endUnrun, endRecorded), as finalize
// does of the others: through the delivery's observer when it has one,
// otherwise as an execution of its own that ends with the envelope, so that
// every envelope this worker creates is counted and logged once.
func (x *execution) observeFinalized(env *envelope.Envelope) {
	w := x.w
	if x.obs != nil {
		x.obs.Finalized(env)
	} else {
		_, obs := w.cfg.Observer.Begin(w.base, w.observed(x.meta, x.req, w.cfg.Capabilities[x.req.CapabilityID] != nil))
		obs.Finalized(env)
		obs.End()
	}
	w.logFinalized(env)
}

// logFinalized logs an execution's end, at Info: its fields are not even
// made into a record's attributes when the logger leaves Info out.
func (w *worker) logFinalized(env *envelope.Envelope) {
	if !w.log.Enabled(context.Background(), slog.LevelInfo) {
		return
	}
	w.log.Info("execution finalized", "executionId", env.ExecutionID, "capabilityId", env.CapabilityID,
		"status", env.Status, "code", errorCode(env), "attempts", env.Attempts, "durationMs", env.DurationMs)
}

// finalizedRecord is the record written when a request is finalized without
// running (undecodable): it keeps the invariant that an envelope is always
// preceded by its execution's record.
// code, kept as LastError, says which envelope the record stands for.
func (w *worker) finalizedRecord(id, capID string, status envelope.Status, code envelope.Code) *Record {
	now := w.now().UTC()
	return &Record{V: envelope.Version, ExecutionID: id, CapabilityID: capID, State: StateFinalized,
		Worker: w.cfg.ID, Status: status, LastError: code, CreatedAt: now, UpdatedAt: now}
}

// endSwept is finalize without a delivery to acknowledge.
func (x *execution) endSwept(o *outcome, attempts int) bool {
	env := o.env
	env.V, env.ExecutionID, env.CapabilityID = envelope.Version, x.req.ExecutionID, x.req.CapabilityID
	env.Attempts, env.FinalizedBy, env.FinalizedAt = attempts, x.w.cfg.ID, x.w.now().UTC()
	data := o.data
	if data == nil {
		data = map[string]any{}
	}
	data["attempts"] = attempts
	sealed := seal(env, data)
	defer sealed.Release()
	x.emit(o.event, data)
	stored, ok := x.createEnvelope(env, sealed)
	if !ok {
		return false
	}
	_ = x.claim.update(func(r *Record) {
		r.State, r.Status, r.Attempt = StateFinalized, stored.Status, stored.Attempts
		if stored.Error != nil {
			r.LastError = stored.Error.Code
		}
	})
	return true
}
