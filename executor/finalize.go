package executor

import (
	"errors"
	"time"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/broker"
	"github.com/capstan-dev/capstan/envelope"
)

// outcome is a terminal result before it becomes the envelope.
type outcome struct {
	env   *envelope.Envelope
	event string
	data  map[string]any
	cause error // private, for the logs
}

func (x *execution) completed(out envelope.Raw) *outcome {
	return &outcome{env: &envelope.Envelope{Status: envelope.StatusCompleted, Output: out}, event: audit.Completed}
}

func (x *execution) failed(cerr *envelope.CapabilityError) *outcome {
	return x.failure(cerr, false)
}

// failedAfterRun is a failure after the handler was called: its effect may
// have happened.
func (x *execution) failedAfterRun(cerr *envelope.CapabilityError) *outcome {
	return x.failure(cerr, true)
}

func (x *execution) failure(cerr *envelope.CapabilityError, executed bool) *outcome {
	return &outcome{
		env:   &envelope.Envelope{Status: envelope.StatusFailed, Error: cerr.Wire()},
		event: audit.Failed,
		data: map[string]any{"code": string(cerr.Code), "stage": cerr.Stage, "retryable": cerr.Retryable,
			"executedBeforeFailure": executed},
		cause: cerr.Cause,
	}
}

func (x *execution) cancelled(code envelope.Code, msg string) *outcome {
	return x.stopped(&envelope.CapabilityError{Code: code, Stage: envelope.StageCancelation, ExposeToModel: true, Message: msg})
}

// stopped is the outcome of an execution the runtime stopped rather than one
// that failed on its own: the caller's cancel or deadline (CANCELLED), or a
// last attempt that timed out (TIMEOUT). Status cancelled, event
// capability.cancelled, its code telling the two apart.
func (x *execution) stopped(cerr *envelope.CapabilityError) *outcome {
	return &outcome{
		env:   &envelope.Envelope{Status: envelope.StatusCancelled, Error: cerr.Wire()},
		event: audit.Cancelled,
		data:  map[string]any{"code": string(cerr.Code), "stage": cerr.Stage, "retryable": cerr.Retryable},
	}
}

// finalize is stage 14: the terminal event, the one envelope (create-only:
// a second finalization is refused by the server and audited), the record,
// then the ack.
func (x *execution) finalize(o *outcome, attempts int) {
	w := x.w
	now := time.Now().UTC()
	env := o.env
	env.V = envelope.Version
	env.ExecutionID = x.req.ExecutionID
	env.CapabilityID = x.req.CapabilityID
	env.Attempts = attempts
	env.DurationMs = time.Since(x.start).Milliseconds()
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

	if !x.createEnvelope(env) {
		return
	}
	_ = x.update(func(r *Record) {
		r.State, r.Status, r.Attempt = StateFinalized, env.Status, attempts
		if o.cause != nil {
			r.Cause = o.cause.Error()
		}
	})
	ackSync(x.msg)
}

// createEnvelope writes the envelope once. It reports whether the message may
// be acknowledged: true when an envelope (ours or another's) exists.
func (x *execution) createEnvelope(env *envelope.Envelope) bool {
	w := x.w
	for try := 0; ; try++ {
		ctx, cancel := storeCtx()
		_, err := broker.Create(ctx, w.b.Envelopes, x.req.ExecutionID, env)
		cancel()
		if err == nil {
			w.finalized.Add(1)
			return true
		}
		if errors.Is(err, broker.ErrExists) {
			ctx, cancel := storeCtx()
			have, _, lerr := broker.Load[envelope.Envelope](ctx, w.b.Envelopes, x.req.ExecutionID)
			cancel()
			if lerr == nil && have.FinalizedBy == env.FinalizedBy && have.FinalizedAt.Equal(env.FinalizedAt) {
				w.finalized.Add(1) // our own write, whose answer was lost
				return true
			}
			w.conflicts.Add(1)
			data := map[string]any{"discardedStatus": string(env.Status), "discardedAttempts": env.Attempts}
			if lerr == nil {
				data["finalizedBy"] = have.FinalizedBy
				data["status"] = string(have.Status)
			}
			x.emit(audit.EnvelopeConflict, data)
			return true
		}
		if try >= 30 || x.w.base.Err() != nil {
			// Leave the message unacknowledged: its redelivery decides again.
			w.log.Error("envelope not written", "executionId", x.req.ExecutionID, "err", err)
			return false
		}
		time.Sleep(backoffStep(try))
	}
}

// checkOutput is stages 12 and 13: validation, redaction, encoding. Nothing
// of an output that fails them leaves the worker.
func (x *execution) checkOutput(out any) (envelope.Raw, *envelope.CapabilityError) {
	invalid := func(err error) *envelope.CapabilityError {
		return &envelope.CapabilityError{Code: envelope.CodeOutputInvalid, Stage: envelope.StageOutput, ExposeToModel: true,
			Message: "The operation ran, but its output is invalid; it was withheld.", Cause: err}
	}
	out, err := x.b.checkOutput(out)
	if err != nil {
		return nil, invalid(err)
	}
	out, err = redact(x.b.meta.RedactOutput, out)
	if err != nil {
		return nil, &envelope.CapabilityError{Code: envelope.CodeInternalError, Stage: envelope.StageRedaction,
			Message: "The operation failed.", Cause: err}
	}
	raw, err := envelope.NewRaw(out)
	if err != nil {
		return nil, invalid(err)
	}
	return raw, nil
}
