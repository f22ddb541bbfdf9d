package engine

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/limits"
	"github.com/capstan-dev/capstan/observe"
)

// attempts runs an admitted execution (DESIGN §4, §6): the capability's
// admission, its limits, the attempts under the lease, the retry rule, the
// output's checks; and, for an attempt lost with its worker, its recovery
// (recover.go). It writes records through the execution's claim and files
// its trail, and returns how the run ends, as an Action: the delivery
// carries it out (delivery.apply).
type attempts struct {
	x *execution
	// unit runs the attempts, once stages 4 to 9 let the execution through.
	unit WorkUnit
	// adm is the admission that let the execution through: the limits it
	// takes (DESIGN §17).
	adm Admission
	// taken is what the execution took of its limits.
	taken limits.Taken
	// retryReason is why the next attempt starts when it is not the retry
	// rule (ReasonReconciledAbsent): audited, and counted on the record.
	retryReason string
	// answer is what the reconciler found of a lost attempt (Recover).
	answer any
	// receipts takes what the attempt running records of its effect.
	receipts receipts
}

// run drives the pipeline of DESIGN §4 for a claimed execution (Run,
// Retry), and returns how it ends: stages 4 to 9 and 12 to 13 are the
// capability's (Admit, Readmit, WorkUnit.Output), the rest are here.
// fromAttempt > 0 resumes a takeover at stage 11 with that attempt, after
// prevCode. An execution of a capability no pool serves ends
// CAPABILITY_NOT_FOUND.
//
// An execution on the short path (claimNew) comes here unclaimed: stages
// 4 to 9 run before its record exists, and the start of attempt 1 creates it.
func (at *attempts) run(fromAttempt int, prevCode envelope.Code) Action {
	x := at.x
	c := x.cap
	if c == nil {
		return Action{Do: NotFound}
	}
	if x.claim.held() != nil {
		x.lease.start()
	}
	// 2: the request is audited before anything can refuse it.
	x.audited()
	if x.ctx.Err() != nil {
		return at.endByContext(0)
	}
	// 3–9 ran before any attempt started; a takeover of a running execution
	// only needs the input back, and the approval it consumed.
	// (A reconciliation readmitted it already.)
	if at.unit == nil {
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
			return at.endByContext(0)
		case adm.Refusal != nil:
			n := 0
			if fromAttempt > 0 {
				n = x.claim.record().Attempt
			}
			return Action{Do: Finish, end: failed(adm.Refusal), Attempts: n}
		case adm.Approval != nil:
			return Action{Do: AwaitApproval, need: adm.Approval}
		}
		at.unit, at.adm = adm.Unit, adm
	}
	if len(at.adm.Limits) > 0 {
		if a, ok := at.takeLimits(at.adm, fromAttempt); !ok {
			return a
		}
	}

	// 10–11: controls and the attempts.
	attempt := fromAttempt
	if attempt == 0 {
		attempt = 1
	} else {
		data := map[string]any{"attempt": attempt, "previousErrorCode": string(prevCode)}
		if at.retryReason != "" {
			data["reason"] = at.retryReason
		}
		x.emit(audit.EventRetried, data)
		x.obs.Retried(attempt, prevCode)
	}
	for {
		if err := x.ctx.Err(); err != nil {
			return at.endByContext(attempt - 1)
		}
		if x.claim.held() == nil {
			// The short path's claim: the record of attempt 1, create-only.
			rec := x.newRecord(StateRunning)
			rec.Attempt, rec.StartedAt = attempt, rec.CreatedAt
			if !x.create(rec) {
				return x.yield()
			}
			x.lease.start()
		} else {
			endStart := x.stage(observe.StageStart)
			reattempt := at.retryReason == ReasonReconciledAbsent
			err := x.claim.update(func(r *Record) {
				now := x.w.now().UTC()
				r.State, r.Attempt, r.StartedAt, r.LastError = StateRunning, attempt, now, ""
				r.LeaseUntil = now.Add(x.w.cfg.Lease) // a full lease for the attempt that starts
				// What a lost attempt before it left is its own.
				r.Receipt, r.ReceiptAttempt, r.ReceiptAt, r.Reconciliations = nil, 0, time.Time{}, 0
				if reattempt {
					r.Reattempts++
				}
				r.Progress = nil // the last attempt's
			})
			at.retryReason = ""
			endStart(err)
			if err != nil {
				return x.endByRecord(err, attempt-1)
			}
		}
		started := x.event(audit.EventStarted, at.unit.Started(attempt))
		if x.w.cfg.StrictAudit {
			endAudit := x.stage(observe.StageAudit)
			err := x.trail.flushSync(x.ctx, started)
			endAudit(err)
			if err != nil {
				if x.ctx.Err() != nil {
					return at.endByContext(attempt - 1)
				}
				return Action{Do: Finish, Attempts: attempt - 1, end: failed(&envelope.CapabilityError{
					Code: envelope.CodeAuditUnavailable, Stage: envelope.StageControls, Retryable: true, ExposeToModel: true,
					Message: "The audit trail is unavailable; the operation was not run.", Cause: err})}
			}
		} else {
			x.trail.publish(started)
			x.trail.flushSoon()
		}

		out, cerr, receipt := at.attempt(attempt, c.Timeout())
		if cerr == nil {
			// 12–13: the output's validation, redaction and encoding.
			raw, oerr := at.unit.Output(out)
			if oerr != nil {
				return Action{Do: Finish, end: failedAfterRun(oerr), Attempts: attempt}
			}
			return Action{Do: Finish, end: completed(raw), Attempts: attempt}
		}
		switch cause := context.Cause(x.ctx); {
		case errors.Is(cause, errLeaseLost):
			x.w.log.Warn("claim lost during the attempt: leaving the execution to its new owner", "executionId", x.req.ExecutionID)
			return Action{}
		case errors.Is(cause, errShutdown):
			return Action{Do: Release}
		case receipt != nil && stoppedByRuntime(cerr):
			// Stopped (its timeout, the caller's cancel) after it recorded
			// that its effect happened: it completed (DESIGN §5).
			return Action{Do: Recover, How: envelope.RecoveredByReceipt, Attempts: attempt}
		case x.ctx.Err() != nil:
			return at.endByContext(attempt)
		}
		if delay, ok := c.Retry(attempt, cerr); ok {
			if err := x.claim.update(func(r *Record) { r.State, r.LastError = StateBackoff, cerr.Code }); err != nil {
				return x.endByRecord(err, attempt)
			}
			t := time.NewTimer(delay)
			select {
			case <-t.C:
			case <-x.ctx.Done():
				t.Stop()
				if errors.Is(context.Cause(x.ctx), errShutdown) {
					return Action{Do: Release}
				}
				if errors.Is(context.Cause(x.ctx), errLeaseLost) {
					return Action{}
				}
				return at.endByContext(attempt)
			}
			attempt++
			x.emit(audit.EventRetried, map[string]any{"attempt": attempt, "previousErrorCode": string(cerr.Code)})
			x.obs.Retried(attempt, cerr.Code)
			continue
		}
		return Action{Do: Fail, Err: cerr, AfterRun: true, Attempts: attempt}
	}
}

// stoppedByRuntime reports whether an attempt's failure is the runtime
// stopping it (its timeout, the caller's cancel or deadline) rather than
// the handler's own answer.
func stoppedByRuntime(cerr *envelope.CapabilityError) bool {
	return cerr.Stage == envelope.StageTimeout || cerr.Stage == envelope.StageCancelation
}

// attempt calls the handler once under the attempt's timeout. After a timeout
// or a cancel it neither waits for nor uses the handler's output. It returns
// the receipt the attempt recorded, if any, once no more may be.
func (at *attempts) attempt(n int, timeout time.Duration) (_ any, _ *envelope.CapabilityError, receipt envelope.Raw) {
	at.receipts.open(n)
	out, cerr := at.call(n, timeout)
	return out, cerr, at.receipts.close(n)
}

// call is attempt's call of the handler.
func (at *attempts) call(n int, timeout time.Duration) (_ any, cerr *envelope.CapabilityError) {
	x := at.x
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
	x.w.stats.handlerCalls.Add(1)
	x.lease.progress.begin(n)
	defer x.lease.progress.end()
	a := Attempt{N: n, Logger: x.w.log.With("executionId", x.req.ExecutionID, "capabilityId", x.req.CapabilityID, "attempt", n),
		Progress: &x.lease.progress, Receipts: &at.receipts}
	go func() {
		defer func() {
			if r := recover(); r != nil {
				ch <- result{err: fmt.Errorf("handler panicked: %v\n%s", r, debug.Stack())}
			}
		}()
		out, err := at.unit.Work(ctx, a)
		ch <- result{out, err}
	}()
	var res result
	select {
	case res = <-ch:
	case <-ctx.Done():
		select {
		case res = <-ch: // it returned as well: its result was there first
		default:
			x.w.stats.abandoned.Add(1)
			return nil, at.contextError(ctx)
		}
	}
	if res.err != nil {
		// A handler that returns because its context ended reports the context's
		// reason, not its own wording of it.
		if ctx.Err() != nil && (errors.Is(res.err, ctx.Err()) || errors.Is(res.err, context.Cause(ctx))) {
			return nil, at.contextError(ctx)
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

func (at *attempts) contextError(attemptCtx context.Context) *envelope.CapabilityError {
	x := at.x
	if x.ctx.Err() != nil {
		return at.cancelledError()
	}
	if errors.Is(context.Cause(attemptCtx), errAttemptTimeout) {
		return at.timeoutError()
	}
	return at.cancelledError()
}

func (at *attempts) timeoutError() *envelope.CapabilityError { return timeoutError(at.x.cap.Timeout()) }

func (at *attempts) cancelledError() *envelope.CapabilityError {
	x := at.x
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
func afterRun(cerr *envelope.CapabilityError) *outcome {
	if cerr.Code == envelope.CodeTimeout && cerr.Stage == envelope.StageTimeout {
		return stopped(cerr)
	}
	return failedAfterRun(cerr)
}

// endByContext is how an execution whose whole context ended ends: left to
// the claim's new owner, given back on shutdown, otherwise cancelled.
func (at *attempts) endByContext(n int) Action {
	x := at.x
	switch cause := context.Cause(x.ctx); {
	case errors.Is(cause, errLeaseLost):
		return Action{}
	case errors.Is(cause, errShutdown):
		return Action{Do: Release}
	}
	return Action{Do: Finish, Attempts: n, end: cancelled(envelope.CodeCancelled, at.cancelledError().Message)}
}
