package engine

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
func (e *Execution) run(fresh bool, fromAttempt int, prevCode envelope.Code) {
	if e.claim.held() != nil {
		e.lease.start()
	}
	c := e.cap
	// 2: the request is audited before anything can refuse it.
	if fresh {
		e.emit(audit.Requested, nil)
	}
	if e.ctx.Err() != nil {
		e.endByContext(0)
		return
	}
	// 3–9 ran before any attempt started; a takeover of a running execution
	// only needs the input back, and the approval it consumed.
	var adm Admission
	if fromAttempt == 0 {
		adm = c.Admit(e.ctx, e.request())
	} else {
		adm = c.Readmit(e.ctx, e.request())
	}
	for _, ev := range adm.Events {
		e.emit(ev.Type, ev.Data)
	}
	switch {
	case adm.Stopped:
		e.endByContext(0)
		return
	case adm.Refusal != nil:
		attempts := 0
		if fromAttempt > 0 {
			attempts = e.claim.record().Attempt
		}
		e.finalize(e.failed(adm.Refusal), attempts)
		return
	case adm.Approval != nil:
		e.awaitApproval(adm.Approval)
		return
	}
	e.unit = adm.Unit

	// 10–11: controls and the attempts.
	attempt := fromAttempt
	if attempt == 0 {
		attempt = 1
	} else {
		e.emit(audit.Retried, map[string]any{"attempt": attempt, "previousErrorCode": string(prevCode)})
		e.obs.Retried(attempt, prevCode)
	}
	for {
		if err := e.ctx.Err(); err != nil {
			e.endByContext(attempt - 1)
			return
		}
		if e.claim.held() == nil {
			// The short path's claim: the record of attempt 1, create-only.
			rec := e.newRecord(StateRunning)
			rec.Attempt, rec.StartedAt = attempt, rec.CreatedAt
			if !e.create(rec) {
				e.yieldClaim()
				return
			}
			e.lease.start()
		} else {
			endStart := e.stage(observe.StageStart)
			err := e.claim.update(func(r *Record) {
				now := e.r.now().UTC()
				r.State, r.Attempt, r.StartedAt, r.LastError = StateRunning, attempt, now, ""
				r.LeaseUntil = now.Add(e.r.cfg.Lease) // a full lease for the attempt that starts
			})
			endStart(err)
			if err != nil {
				e.endByRecord(err, attempt-1)
				return
			}
		}
		started := e.event(audit.Started, e.unit.Started(attempt))
		if e.r.cfg.StrictAudit {
			endAudit := e.stage(observe.StageAudit)
			err := e.trail.flushSync(e.ctx, started)
			endAudit(err)
			if err != nil {
				if e.ctx.Err() != nil {
					e.endByContext(attempt - 1)
					return
				}
				e.finalize(e.failed(&envelope.CapabilityError{Code: envelope.CodeAuditUnavailable, Stage: envelope.StageControls,
					Retryable: true, ExposeToModel: true, Message: "The audit trail is unavailable; the operation was not run.", Cause: err}),
					attempt-1)
				return
			}
		} else {
			e.trail.publish(started)
			e.trail.flushSoon()
		}

		out, cerr := e.attempt(attempt, c.Timeout())
		if cerr == nil {
			// 12–13: the output's validation, redaction and encoding.
			raw, oerr := e.unit.Output(out)
			if oerr != nil {
				e.finalize(e.failedAfterRun(oerr), attempt)
				return
			}
			e.finalize(e.completed(raw), attempt)
			return
		}
		switch cause := context.Cause(e.ctx); {
		case errors.Is(cause, errLeaseLost):
			e.r.log.Warn("claim lost during the attempt: leaving the execution to its new owner", "executionId", e.req.ExecutionID)
			return
		case errors.Is(cause, errShutdown):
			e.release()
			return
		case e.ctx.Err() != nil:
			e.endByContext(attempt)
			return
		}
		if delay, ok := c.Retry(attempt, cerr); ok {
			if err := e.claim.update(func(r *Record) { r.State, r.LastError = StateBackoff, cerr.Code }); err != nil {
				e.endByRecord(err, attempt)
				return
			}
			t := time.NewTimer(delay)
			select {
			case <-t.C:
			case <-e.ctx.Done():
				t.Stop()
				if errors.Is(context.Cause(e.ctx), errShutdown) {
					e.release()
					return
				}
				if errors.Is(context.Cause(e.ctx), errLeaseLost) {
					return
				}
				e.endByContext(attempt)
				return
			}
			attempt++
			e.emit(audit.Retried, map[string]any{"attempt": attempt, "previousErrorCode": string(cerr.Code)})
			e.obs.Retried(attempt, cerr.Code)
			continue
		}
		e.finalize(e.afterRun(cerr), attempt)
		return
	}
}

// attempt calls the handler once under the attempt's timeout. After a timeout
// or a cancel it neither waits for nor uses the handler's output.
func (e *Execution) attempt(n int, timeout time.Duration) (_ any, cerr *envelope.CapabilityError) {
	ctx, cancel := context.WithTimeoutCause(e.ctx, timeout, errAttemptTimeout)
	defer cancel()
	ctx, end := e.obs.Attempt(ctx, n)
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
	e.r.handlerCalls.Add(1)
	a := Attempt{N: n, Logger: e.r.log.With("executionId", e.req.ExecutionID, "capabilityId", e.req.CapabilityID, "attempt", n)}
	go func() {
		defer func() {
			if r := recover(); r != nil {
				ch <- result{err: fmt.Errorf("handler panicked: %v\n%s", r, debug.Stack())}
			}
		}()
		out, err := e.unit.Work(ctx, a)
		ch <- result{out, err}
	}()
	var res result
	select {
	case res = <-ch:
	case <-ctx.Done():
		select {
		case res = <-ch: // it returned as well: its result was there first
		default:
			e.r.abandoned.Add(1)
			return nil, e.contextError(ctx)
		}
	}
	if res.err != nil {
		// A handler that returns because its context ended reports the context's
		// reason, not its own wording of it.
		if ctx.Err() != nil && (errors.Is(res.err, ctx.Err()) || errors.Is(res.err, context.Cause(ctx))) {
			return nil, e.contextError(ctx)
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

func (e *Execution) contextError(attemptCtx context.Context) *envelope.CapabilityError {
	if e.ctx.Err() != nil {
		return e.cancelledError()
	}
	if errors.Is(context.Cause(attemptCtx), errAttemptTimeout) {
		return e.timeoutError()
	}
	return e.cancelledError()
}

func (e *Execution) timeoutError() *envelope.CapabilityError { return timeoutError(e.cap.Timeout()) }

func (e *Execution) cancelledError() *envelope.CapabilityError {
	msg := "The caller cancelled the execution."
	if errors.Is(context.Cause(e.ctx), errDeadline) {
		msg = "The request's deadline passed."
	}
	return &envelope.CapabilityError{Code: envelope.CodeCancelled, Stage: envelope.StageCancelation, ExposeToModel: true, Message: msg}
}

// afterRun is the outcome of a last attempt that failed. A timeout is the
// runtime stopping the handler, as a cancel is: status cancelled, code
// TIMEOUT (still retryable for the caller), event capability.cancelled. A
// failure the handler reported is status failed, event capability.failed.
func (e *Execution) afterRun(cerr *envelope.CapabilityError) *outcome {
	if cerr.Code == envelope.CodeTimeout && cerr.Stage == envelope.StageTimeout {
		return e.stopped(cerr)
	}
	return e.failedAfterRun(cerr)
}

// endByContext finalizes an execution whose whole context ended.
func (e *Execution) endByContext(attempts int) {
	switch cause := context.Cause(e.ctx); {
	case errors.Is(cause, errLeaseLost):
		return
	case errors.Is(cause, errShutdown):
		e.release()
		return
	}
	e.finalize(e.cancelled(envelope.CodeCancelled, e.cancelledError().Message), attempts)
}

// endByRecord handles a failed record update.
func (e *Execution) endByRecord(err error, attempts int) {
	if errors.Is(err, errCancelRequested) {
		e.finalize(e.cancelled(envelope.CodeCancelled, "The caller cancelled the execution."), attempts)
		return
	}
	// Lost: another worker owns it. Unsettled: the store did not answer; the
	// redelivery decides once the lease has run out.
	e.r.log.Warn("execution record not updated: leaving the execution", "executionId", e.req.ExecutionID, "err", err)
}

// release gives the execution back on shutdown: the lease ends now and the
// message is redelivered at once, so a live worker takes it over.
func (e *Execution) release() {
	if e.claim.held() == nil {
		e.trail.drop()
		_ = e.msg.Nak() // nothing claimed yet
		return
	}
	e.lease.halt()
	if err := e.claim.update(func(r *Record) { r.LeaseUntil = e.r.now().UTC() }); errors.Is(err, errLost) {
		return // another worker owns it, and its delivery
	}
	_ = e.msg.Nak()
}

// awaitApproval ends a call that needs an approval (stage 8): claimed first
// (the short path runs stages 4 to 9 before its claim, and the approval is
// a write), the approval's id reserved on the record, so that a takeover of
// this execution finds the same approval instead of asking twice, the
// approval stored, then the envelope approval-required.
func (e *Execution) awaitApproval(need *ApprovalNeeded) {
	defer e.stage(observe.StageApproval)(nil)
	if !e.claimBeforeWrite() {
		return // another record was there, and decided
	}
	id := e.claim.record().ApprovalID
	if id == "" {
		id = envelope.NewExecutionID()
		if err := e.claim.update(func(r *Record) { r.ApprovalID = id }); err != nil {
			e.endByRecord(err, 0)
			return
		}
	}
	ctx, cancel := StoreContext()
	defer cancel()
	ref, data, cerr := need.Store(ctx, id)
	if cerr != nil {
		e.finalize(e.failed(cerr), 0)
		return
	}
	e.finalize(e.approvalRequired(ref, data), 0)
}

// request is what the stages see of the execution.
func (e *Execution) request() Request {
	return Request{Request: e.req, Principal: e.principal, SubjectCapability: e.subjectCapability, Stage: e.stage}
}
