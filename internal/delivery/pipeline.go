package delivery

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/observe"
)

// run drives the pipeline of DESIGN §4 for a claimed execution: stages 4 to 9
// and 12 to 13 are the capability's (Admit, Readmit, WorkUnit.Output), the
// rest are here. fresh is set on a first claim (stage 2's event is emitted
// once). fromAttempt > 0 resumes a takeover at stage 11 with that attempt,
// after prevCode.
//
// An execution on the short path (claimAndRun) comes here unclaimed: stages
// 4 to 9 run before its record exists, and the start of attempt 1 creates it.
func (x *Execution) run(fresh bool, fromAttempt int, prevCode envelope.Code) {
	if x.claim.held() != nil {
		x.lease.start()
	}
	c := x.cap
	// 2: the request is audited before anything can refuse it.
	if fresh {
		x.emit(audit.Requested, nil)
	}
	if x.ctx.Err() != nil {
		x.endByContext(0)
		return
	}
	// 3–9 ran before any attempt started; a takeover of a running execution
	// only needs the input back, and the approval it consumed.
	var adm Admission
	if fromAttempt == 0 {
		adm = c.Admit(x.ctx, x.request())
	} else {
		adm = c.Readmit(x.ctx, x.request())
	}
	for _, ev := range adm.Events {
		x.emit(ev.Type, ev.Data)
	}
	switch {
	case adm.Stopped:
		x.endByContext(0)
		return
	case adm.Refusal != nil:
		attempts := 0
		if fromAttempt > 0 {
			attempts = x.claim.record().Attempt
		}
		x.finalize(x.failed(adm.Refusal), attempts)
		return
	case adm.Approval != nil:
		x.awaitApproval(adm.Approval)
		return
	}
	x.unit = adm.Unit

	// 10–11: controls and the attempts.
	attempt := fromAttempt
	if attempt == 0 {
		attempt = 1
	} else {
		x.emit(audit.Retried, map[string]any{"attempt": attempt, "previousErrorCode": string(prevCode)})
		x.obs.Retried(attempt, prevCode)
	}
	for {
		if err := x.ctx.Err(); err != nil {
			x.endByContext(attempt - 1)
			return
		}
		if x.claim.held() == nil {
			// The short path's claim: the record of attempt 1, create-only.
			rec := x.newRecord(StateRunning)
			rec.Attempt, rec.StartedAt = attempt, rec.CreatedAt
			if !x.create(rec) {
				x.yieldClaim()
				return
			}
			x.lease.start()
		} else {
			endStart := x.stage(observe.StageStart)
			err := x.claim.update(func(r *Record) {
				now := x.w.now().UTC()
				r.State, r.Attempt, r.StartedAt, r.LastError = StateRunning, attempt, now, ""
				r.LeaseUntil = now.Add(x.w.cfg.Lease) // a full lease for the attempt that starts
			})
			endStart(err)
			if err != nil {
				x.endByRecord(err, attempt-1)
				return
			}
		}
		started := x.event(audit.Started, x.unit.Started(attempt))
		if x.w.cfg.StrictAudit {
			endAudit := x.stage(observe.StageAudit)
			err := x.trail.flushSync(x.ctx, started)
			endAudit(err)
			if err != nil {
				if x.ctx.Err() != nil {
					x.endByContext(attempt - 1)
					return
				}
				x.finalize(x.failed(&envelope.CapabilityError{Code: envelope.CodeAuditUnavailable, Stage: envelope.StageControls,
					Retryable: true, ExposeToModel: true, Message: "The audit trail is unavailable; the operation was not run.", Cause: err}),
					attempt-1)
				return
			}
		} else {
			x.trail.publish(started)
			x.trail.flushSoon()
		}

		out, cerr := x.attempt(attempt, c.Timeout())
		if cerr == nil {
			// 12–13: the output's validation, redaction and encoding.
			raw, oerr := x.unit.Output(out)
			if oerr != nil {
				x.finalize(x.failedAfterRun(oerr), attempt)
				return
			}
			x.finalize(x.completed(raw), attempt)
			return
		}
		switch cause := context.Cause(x.ctx); {
		case errors.Is(cause, errLeaseLost):
			x.w.log.Warn("claim lost during the attempt: leaving the execution to its new owner", "executionId", x.req.ExecutionID)
			return
		case errors.Is(cause, errShutdown):
			x.release()
			return
		case x.ctx.Err() != nil:
			x.endByContext(attempt)
			return
		}
		if delay, ok := c.Retry(attempt, cerr); ok {
			if err := x.claim.update(func(r *Record) { r.State, r.LastError = StateBackoff, cerr.Code }); err != nil {
				x.endByRecord(err, attempt)
				return
			}
			t := time.NewTimer(delay)
			select {
			case <-t.C:
			case <-x.ctx.Done():
				t.Stop()
				if errors.Is(context.Cause(x.ctx), errShutdown) {
					x.release()
					return
				}
				if errors.Is(context.Cause(x.ctx), errLeaseLost) {
					return
				}
				x.endByContext(attempt)
				return
			}
			attempt++
			x.emit(audit.Retried, map[string]any{"attempt": attempt, "previousErrorCode": string(cerr.Code)})
			x.obs.Retried(attempt, cerr.Code)
			continue
		}
		x.finalize(x.afterRun(cerr), attempt)
		return
	}
}

// attempt calls the handler once under the attempt's timeout. After a timeout
// or a cancel it neither waits for nor uses the handler's output.
func (x *Execution) attempt(n int, timeout time.Duration) (_ any, cerr *envelope.CapabilityError) {
	ctx, cancel := context.WithTimeoutCause(x.ctx, timeout, errAttemptTimeout)
	defer cancel()
	ctx, end := x.obs.Attempt(ctx, n)
	defer func() {
		var code envelope.Code
		if cerr != nil {
			code = cerr.Code
		}
		end(code)
	}()
	type result struct {
		out any
		err error
	}
	ch := make(chan result, 1)
	x.w.handlerCalls.Add(1)
	a := Attempt{N: n, Logger: x.w.log.With("executionId", x.req.ExecutionID, "capabilityId", x.req.CapabilityID, "attempt", n)}
	go func() {
		defer func() {
			if r := recover(); r != nil {
				ch <- result{err: fmt.Errorf("handler panicked: %v\n%s", r, debug.Stack())}
			}
		}()
		out, err := x.unit.Work(ctx, a)
		ch <- result{out, err}
	}()
	var res result
	select {
	case res = <-ch:
	case <-ctx.Done():
		select {
		case res = <-ch: // it returned as well: its result was there first
		default:
			x.w.abandoned.Add(1)
			return nil, x.contextError(ctx)
		}
	}
	if res.err != nil {
		// A handler that returns because its context ended reports the context's
		// reason, not its own wording of it.
		if ctx.Err() != nil && (errors.Is(res.err, ctx.Err()) || errors.Is(res.err, context.Cause(ctx))) {
			return nil, x.contextError(ctx)
		}
		return nil, handlerError(res.err)
	}
	return res.out, nil
}

// runtimeCodes are asserted by the runtime alone, never by a handler.
var runtimeCodes = map[envelope.Code]bool{
	envelope.CodeTimeout:        true,
	envelope.CodeCancelled:      true,
	envelope.CodeOutcomeUnknown: true,
	envelope.CodeWorkerLost:     true,
}

// handlerError classifies what a handler returned. A declared error (a
// *envelope.CapabilityError anywhere in the chain) speaks for itself at the
// handler stage; anything else is EXECUTION_FAILED, not retryable and not
// exposed. Either way the result wraps the handler's own error, so a RetryOn
// function and the logs can inspect it with errors.Is and errors.As.
func handlerError(err error) *envelope.CapabilityError {
	var ce *envelope.CapabilityError
	if !errors.As(err, &ce) {
		return &envelope.CapabilityError{Code: envelope.CodeExecutionFailed, Stage: envelope.StageHandler,
			Message: "The operation failed.", Cause: err}
	}
	c := *ce // never change the handler's value: it may be a shared sentinel
	c.Stage, c.Cause = envelope.StageHandler, err
	if c.Code == "" || runtimeCodes[c.Code] {
		c.Code = envelope.CodeExecutionFailed
	}
	if c.Message == "" {
		c.Message = "The operation failed."
	}
	return &c
}

func (x *Execution) contextError(attemptCtx context.Context) *envelope.CapabilityError {
	if x.ctx.Err() != nil {
		return x.cancelledError()
	}
	if errors.Is(context.Cause(attemptCtx), errAttemptTimeout) {
		return x.timeoutError()
	}
	return x.cancelledError()
}

func (x *Execution) timeoutError() *envelope.CapabilityError { return timeoutError(x.cap.Timeout()) }

func (x *Execution) cancelledError() *envelope.CapabilityError {
	msg := "The caller cancelled the execution."
	if errors.Is(context.Cause(x.ctx), errDeadline) {
		msg = "The request's deadline passed."
	}
	return &envelope.CapabilityError{Code: envelope.CodeCancelled, Stage: envelope.StageCancelation, ExposeToModel: true, Message: msg}
}

// afterRun is the outcome of a last attempt that failed. A timeout is the
// runtime stopping the handler, as a cancel is: status cancelled, code
// TIMEOUT (still retryable for the caller), event capability.cancelled. A
// failure the handler reported is status failed, event capability.failed.
func (x *Execution) afterRun(cerr *envelope.CapabilityError) *outcome {
	if cerr.Code == envelope.CodeTimeout && cerr.Stage == envelope.StageTimeout {
		return x.stopped(cerr)
	}
	return x.failedAfterRun(cerr)
}

// endByContext finalizes an execution whose whole context ended.
func (x *Execution) endByContext(attempts int) {
	switch cause := context.Cause(x.ctx); {
	case errors.Is(cause, errLeaseLost):
		return
	case errors.Is(cause, errShutdown):
		x.release()
		return
	}
	x.finalize(x.cancelled(envelope.CodeCancelled, x.cancelledError().Message), attempts)
}

// endByRecord handles a failed record update.
func (x *Execution) endByRecord(err error, attempts int) {
	if errors.Is(err, errCancelRequested) {
		x.finalize(x.cancelled(envelope.CodeCancelled, "The caller cancelled the execution."), attempts)
		return
	}
	// Lost: another worker owns it. Unsettled: the store did not answer; the
	// redelivery decides once the lease has run out.
	x.w.log.Warn("execution record not updated: leaving the execution", "executionId", x.req.ExecutionID, "err", err)
}

// release gives the execution back on shutdown: the lease ends now and the
// message is redelivered at once, so a live worker takes it over.
func (x *Execution) release() {
	if x.claim.held() == nil {
		x.trail.drop()
		_ = x.msg.Nak() // nothing claimed yet
		return
	}
	x.lease.halt()
	if err := x.claim.update(func(r *Record) { r.LeaseUntil = x.w.now().UTC() }); errors.Is(err, errLost) {
		return // another worker owns it, and its delivery
	}
	_ = x.msg.Nak()
}

// awaitApproval ends a call that needs an approval (stage 8): claimed first
// (the short path runs stages 4 to 9 before its claim, and the approval is
// a write), the approval's id reserved on the record, so that a takeover of
// this execution finds the same approval instead of asking twice, the
// approval stored, then the envelope approval-required.
func (x *Execution) awaitApproval(need *ApprovalNeeded) {
	defer x.stage(observe.StageApproval)(nil)
	if !x.claimBeforeWrite() {
		return // another record was there, and decided
	}
	id := x.claim.record().ApprovalID
	if id == "" {
		id = envelope.NewExecutionID()
		if err := x.claim.update(func(r *Record) { r.ApprovalID = id }); err != nil {
			x.endByRecord(err, 0)
			return
		}
	}
	ctx, cancel := StoreContext()
	defer cancel()
	ref, data, cerr := need.Store(ctx, id)
	if cerr != nil {
		x.finalize(x.failed(cerr), 0)
		return
	}
	x.finalize(x.approvalRequired(ref, data), 0)
}

// request is what the stages see of the execution.
func (x *Execution) request() Request {
	return Request{Request: x.req, Principal: x.principal, SubjectCapability: x.subjectCapability, Stage: x.stage}
}
