package delivery

import (
	"errors"
	"time"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/broker"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/nats-io/nats.go/jetstream"
)

// DESIGN §13: every request ends. A request carries when it must have started
// (startBy, set by its client); a request no worker started by then ends
// failed / NOT_STARTED. The record TTL bounds it too: the exec stream drops a
// request at the record TTL (MaxAge), and a request is never claimed from
// scratch within ttlMargin of it. (A record itself goes one record window
// after its last write; a redelivery that finds none decides as
// checkedFresh says.) The check is a comparison on the delivery; the sweeper
// (sweep.go) ends the requests no worker is given.

// ttlMargin is how long before the record TTL a request stops being started.
func ttlMargin(ttl time.Duration) time.Duration { return min(ttl/10, time.Hour) }

// startDeadline is when a request stored at stored must have started: its
// startBy, and at the latest ttlMargin before its age reaches the record TTL.
func (w *Runner) startDeadline(stored time.Time, req *envelope.Request) time.Time {
	d := w.ttlDeadline(stored)
	if req.StartBy != nil && req.StartBy.Before(d) {
		d = *req.StartBy
	}
	return d
}

// ttlDeadline is when a request stored at stored must end: past it, nothing
// may start or retry it, and the sweeper finalizes what is left.
func (w *Runner) ttlDeadline(stored time.Time) time.Time {
	ttl := w.b.Config.RecordTTL
	return stored.Add(ttl - ttlMargin(ttl))
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

// startExpired reports whether the delivery's request is past its start
// deadline.
func (x *Execution) startExpired() bool {
	if x.msg == nil {
		return false
	}
	meta, err := x.msg.Metadata()
	if err != nil {
		return false
	}
	return x.w.now().After(x.w.startDeadline(meta.Timestamp, x.req))
}

// finalizeRecorded writes the envelope a finalized record stands for and
// that was never written: a record finalized before its envelope (a request
// refused before its claim, one that never started, one that does not
// decode) whose writer was lost between the two writes, or gave up on the
// envelope. The envelope is rebuilt from the record's status and error code.
// It reports whether the envelope exists. A record older than the envelope
// retention is not repaired: its envelope may have been written and expired
// since.
func (w *Runner) finalizeRecorded(x *Execution, rec *Record) bool {
	if rec.State != StateFinalized {
		return false
	}
	if r := w.envelopeRetention(); r > 0 && w.now().Sub(rec.UpdatedAt) >= r {
		return true
	}
	env := recordedEnvelope(x.req, rec)
	env.V, env.FinalizedBy, env.FinalizedAt = envelope.Version, w.cfg.ID, w.now().UTC()
	ctx, cancel := StoreContext()
	defer cancel()
	_, err := broker.Create(ctx, w.b.Envelopes, x.key, env)
	if err == nil {
		if env.Error != nil {
			event := audit.Failed
			if env.Status == envelope.StatusCancelled {
				event = audit.Cancelled
			}
			x.emit(event, map[string]any{"code": string(env.Error.Code), "stage": env.Error.Stage,
				"retryable": env.Error.Retryable, "attempts": rec.Attempt,
				"executedBeforeFailure": env.Error.Code == envelope.CodeOutcomeUnknown})
		}
		w.finalized.Add(1)
		w.observeFinalized(x, env)
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

// endedUnstarted ends a delivery whose request is past its start deadline
// and has no record, and reports whether it did; a request with a record is
// left to the takeover table. A delivery of a request that has ended already
// is a duplicate. When finding no record would not prove that the request
// never started (absenceProves: an attempt may have run under a record that
// has expired since), it is not said to have never run: the claiming path
// decides (checkedFresh).
func (w *Runner) endedUnstarted(msg jetstream.Msg, principal string, req *envelope.Request) bool {
	meta, err := msg.Metadata()
	if err != nil {
		return false
	}
	now := w.now()
	if Takeover(Facts{StartDeadline: w.startDeadline(meta.Timestamp, req), Now: now,
		AbsenceProves: absenceProves(req.ExecutionID, meta.Timestamp, meta.NumDelivered == 1, now, w.b.Config.RecordWindow),
	}).Do != EndNotStarted {
		return false
	}
	x := w.bare(msg, req, principal)
	switch ended, err := w.endedBefore(x); {
	case ended:
		ackSync(msg)
		return true
	case err != nil:
		nak(msg, time.Second) // the store did not answer: decide again later
		return true
	}
	x.hashInput()
	done, found, _ := w.finalizeWithoutRun(x, notStartedEnvelope(req), "")
	switch {
	case done:
		w.notStarted.Add(1)
		ackSync(msg)
	case found != nil:
		return false
	default:
		nak(msg, time.Second) // the store did not answer: decide again later
	}
	return true
}

// ttlExpired reports whether the delivery's request is past its TTL deadline.
func (x *Execution) ttlExpired() bool {
	if x.msg == nil {
		return false
	}
	meta, err := x.msg.Metadata()
	return err == nil && x.w.now().After(x.w.ttlDeadline(meta.Timestamp))
}
