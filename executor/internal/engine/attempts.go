package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"runtime/debug"
	"slices"
	"sync"
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
	// abandoned is closed when the handler of an attempt that ended
	// without it (its timeout, a cancel it ignored) returns: until then it
	// runs, and keeps the execution's slot (DESIGN §17). nil: none runs.
	abandoned chan struct{}
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
	if a, ok := at.gate(max(fromAttempt, 1), fromAttempt == 0); !ok {
		return a // an operator's pause or policy set (DESIGN §18)
	}
	if len(at.adm.Limits) > 0 {
		if a, ok := at.takeLimits(at.adm, fromAttempt); !ok {
			return a
		}
	}

	// 10–11: controls and the attempts.
	attempt := fromAttempt
	if hook := x.w.cfg.BeforeAttempt; hook != nil {
		hook(x.req.ExecutionID, max(attempt, 1))
	}
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
		switch {
		case x.unclaimed:
			// A read without a claim: its delivery's ack timer alone is kept.
			x.lease.start()
		case x.claim.held() == nil:
			// The short path's claim: the record of attempt 1, create-only.
			rec := x.newRecord(StateRunning)
			rec.Attempt, rec.StartedAt = attempt, rec.CreatedAt
			if !x.create(rec) {
				return x.yield()
			}
			x.lease.start()
		default:
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
		data := at.unit.Started(attempt)
		if n := x.meta.Deliveries; x.unclaimed && n > 1 {
			// A read's run again after its worker was lost (or the request
			// put back): the trail tells the runtime's re-run, under the
			// same execution, from a new call of the tool.
			data["delivery"] = n
		}
		started := x.event(audit.EventStarted, data)
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
		if a, ok := at.interrupted(attempt, "the attempt"); ok {
			return a
		}
		switch {
		case receipt != nil && stoppedByRuntime(cerr):
			// Stopped (its timeout, the caller's cancel) after it recorded
			// that its effect happened: it completed (DESIGN §5).
			return Action{Do: Recover, How: envelope.RecoveredByReceipt, Attempts: attempt}
		case x.ctx.Err() != nil:
			return at.endByContext(attempt)
		}
		if delay, ok := c.Retry(attempt, cerr); ok {
			if !x.unclaimed {
				if err := x.claim.update(func(r *Record) { r.State, r.LastError = StateBackoff, cerr.Code }); err != nil {
					return x.endByRecord(err, attempt)
				}
			}
			t := time.NewTimer(delay)
			select {
			case <-t.C:
			case <-x.ctx.Done():
				t.Stop()
				return at.endByContext(attempt)
			}
			if !at.abandonedReturned() {
				return at.endByContext(attempt)
			}
			if a, ok := at.gate(attempt+1, false); !ok {
				return a
			}
			attempt++
			x.emit(audit.EventRetried, map[string]any{"attempt": attempt, "previousErrorCode": string(cerr.Code)})
			x.obs.Retried(attempt, cerr.Code)
			continue
		}
		return Action{Do: Fail, Err: cerr, AfterRun: true, Attempts: attempt}
	}
}

// gate is the check before attempt n starts; it reports whether the
// attempt may. fresh is an execution that has run no attempt (attempt 1,
// not a takeover). An operator's pause is read before every attempt; the
// policy set in force, before a retry (the admission read it before the
// first). When the attempt may not, the action ends the execution or puts
// it back.
func (at *attempts) gate(n int, fresh bool) (Action, bool) {
	if a, ok := at.pauseGate(n, fresh); !ok || fresh {
		return a, ok
	}
	events, refusal := at.unit.Recheck()
	for _, ev := range events {
		at.x.emit(ev.Type, ev.Data)
	}
	if refusal != nil {
		return refusedBefore(n, refusal), false
	}
	return Action{}, true
}

// refusedBefore ends an execution refused before attempt n: a retry's says
// the attempts before it ran.
func refusedBefore(n int, cerr *envelope.CapabilityError) Action {
	end := failed(cerr)
	if n > 1 {
		end = failedAfterRun(cerr)
	}
	return Action{Do: Finish, end: end, Attempts: n - 1}
}

// pauseGate is gate's reading of the operators' pauses: a hold gives a
// fresh execution back, and keeps a retry or takeover waiting in place; a
// refusal ends it.
func (at *attempts) pauseGate(n int, fresh bool) (Action, bool) {
	x := at.x
	p := at.pausedNow()
	if p == nil {
		return Action{}, true
	}
	if p.Refusal == nil && fresh {
		x.w.stats.held.Add(1)
		x.w.cfg.Observer.Paused(x.req.CapabilityID, "held")
		if x.claim.held() != nil {
			// Outside the held trail: the put-back drops what it holds.
			x.w.emit(x.event(audit.EventHeld, p.Data))
		}
		// Given back as a limit's wait gives it back: its record names no
		// worker meanwhile.
		return Action{Do: Wait, Delay: x.w.holdFor(x.meta), limit: true}, false
	}
	// A retry or a takeover: an attempt may have run, so the execution keeps
	// its claim and waits here.
	for p != nil && p.Refusal == nil {
		select {
		case <-p.Changed:
		case <-x.ctx.Done():
			return at.endByContext(n - 1), false
		}
		p = at.pausedNow()
	}
	if p == nil {
		return Action{}, true
	}
	x.w.stats.pauseRefused.Add(1)
	x.w.cfg.Observer.Paused(x.req.CapabilityID, "refused")
	return refusedBefore(n, p.Refusal), false
}

// pausedNow is the pause that stops the next attempt, nil when none does,
// in which case the execution is starting until its handler begins.
// starting is set before the pauses are read, and a pause's set is in place
// before a worker looks for what it must cancel or wait for
// (CancelRunning, Starting): of an attempt that read the pauses before a
// change, the worker that made the change sees it starting.
func (at *attempts) pausedNow() *Pause {
	x := at.x
	x.flight.starting.Store(true)
	p := x.w.paused(x.principal, x.req)
	if p != nil {
		x.flight.starting.Store(false)
	}
	return p
}

// takeLimits takes the execution's limits and reports whether its attempts
// may start. When they may not, it returns the capability's choice at the
// limit: the delivery waits (a later delivery tries again, until the start
// deadline), the execution ends RATE_LIMITED, or it asks for an approval. A takeover (fromAttempt > 0) takes its slot again under its own
// claim and nothing else: its rates and budgets were taken when it first
// started; over the slots it waits, whatever the choice, since an attempt
// may have run.
func (at *attempts) takeLimits(adm Admission, fromAttempt int) (Action, bool) {
	x := at.x
	lims := adm.Limits
	if fromAttempt > 0 {
		// Readmit carries the concurrency limits alone; any other is
		// dropped here all the same.
		if slices.ContainsFunc(lims, func(l limits.Limit) bool { return l.Kind != limits.Concurrency }) {
			lims = slices.DeleteFunc(slices.Clone(lims), func(l limits.Limit) bool { return l.Kind != limits.Concurrency })
		}
		if len(lims) == 0 {
			return Action{}, true
		}
	}
	if x.w.limits == nil {
		return at.waitForLimit(time.Second), false
	}
	var approved map[string]int64 // nil unless an approval lets the execution past its budgets
	if adm.Approved {
		for _, l := range lims {
			if l.Kind == limits.Budget && l.Action == limits.Approve {
				if approved == nil {
					approved = map[string]int64{}
				}
				approved[l.Key()] = math.MaxInt64 // the approval bound the input, and so the amount
			}
		}
	}
	h := limits.Holder{Key: x.key, Claim: x.claim.token, Until: x.w.now().UTC().Add(x.w.cfg.Lease), Worker: x.w.cfg.ID}
	taken, over, err := x.w.limits.Take(x.ctx, lims, h, approved)
	if err != nil {
		if x.ctx.Err() != nil {
			return at.endByContext(0), false
		}
		x.w.log.Warn("limits not taken: the delivery waits", "executionId", x.req.ExecutionID, "err", err)
		return at.waitForLimit(time.Second), false
	}
	if over == nil {
		at.taken = taken
		if taken.Slot() {
			x.obs.Slot(true)
		}
		return Action{}, true
	}
	action := over.Limit.Action
	if fromAttempt > 0 || (action == limits.Approve && adm.OverBudget == nil) {
		action = limits.Wait
		if fromAttempt == 0 {
			action = limits.Refuse
		}
	}
	x.w.stats.limited.Add(1)
	x.obs.Limited(string(over.Limit.Kind), string(action))
	data := map[string]any{"limit": over.Limit.String(), "kind": string(over.Limit.Kind), "per": string(over.Limit.Per),
		"max": over.Limit.Max, "used": over.Used, "action": string(action)}
	if over.Limit.Kind == limits.Budget {
		data["amount"] = over.Limit.Amount
	}
	if over.RetryAfter > 0 {
		data["retryAfterMs"] = over.RetryAfter.Milliseconds()
	}
	if over.PrincipalUsed > 0 {
		data["principalMax"], data["principalUsed"] = over.Limit.PrincipalMax, over.PrincipalUsed
	}
	// Filed once per limit (and its principal's share of it) it waits at.
	waitKey := x.key + " " + over.Limit.String()
	if over.PrincipalUsed > 0 {
		waitKey += " principal"
	}
	if action != limits.Wait || x.w.waits.first(waitKey, x.w.now()) {
		// After the request's own event: held with it, or filed after it.
		x.emit(audit.EventLimited, data)
	}
	switch action {
	case limits.Refuse:
		return Action{Do: Finish, end: failed(RateLimitedError(*over))}, false
	case limits.Approve:
		return Action{Do: AwaitApproval, need: adm.OverBudget(over.Limit.String())}, false
	}
	if x.claim.held() == nil {
		// The short path waits claimed, as any other delivery does: its
		// record, given back, tells the deliveries that come back that the
		// request is filed and waits (a listing shows it queued), and the
		// request's events go on the trail now, with the limit's.
		if !x.create(x.newRecord(StateClaimed)) {
			return x.yield(), false
		}
	}
	x.trail.flush()
	return at.waitForLimit(limits.WaitFor(over.RetryAfter, x.meta.Deliveries, rand.Float64())), false
}

// waitForLimit leaves the delivery for a later one, after delay (at most a
// third of the record window), or at the request's start deadline if that
// comes first (then it ends NOT_STARTED).
// A claim this delivery holds is given up first (Wait).
func (at *attempts) waitForLimit(delay time.Duration) Action {
	x := at.x
	// Back within a third of the record window, however long the limit
	// says to wait: each return claims the execution again, which keeps
	// its record. A record lapsed while it waited would leave nothing to
	// prove that no attempt ran, and the call would end OUTCOME_UNKNOWN
	// having never run.
	delay = min(delay, x.w.windows().Record/3)
	if sb := x.req.StartBy; sb != nil {
		delay = min(delay, max(sb.Sub(x.w.now())+10*time.Millisecond, 0))
	}
	return Action{Do: Wait, Delay: delay, limit: true}
}

// releaseLimits gives back the slot the execution took, if any: its
// delivery has ended (finalized, lost to another claim, or left for later).
// A handler abandoned still running keeps it until it returns, or the worker
// stops; past the lease the slot was taken with, a taker that finds the
// slots full judges it by the execution's final record, and frees it.
func (at *attempts) releaseLimits() {
	x := at.x
	if !at.taken.Slot() {
		return
	}
	taken, returned := at.taken, at.abandoned
	at.taken, at.abandoned = limits.Taken{}, nil
	release := func() {
		ctx, cancel := StoreContext()
		defer cancel()
		x.w.limits.Release(ctx, taken)
		x.obs.Slot(false)
	}
	if returned == nil {
		release()
		return
	}
	x.w.releasing.Add(1)
	go func() {
		defer x.w.releasing.Done()
		select {
		case <-returned:
			release()
		case <-x.w.base.Done():
		}
	}()
}

// abandonedReturned waits, before an execution holding a slot starts another
// attempt, for the handler of the last one to return if it was abandoned:
// one slot runs one handler. False: the execution's context ended first.
func (at *attempts) abandonedReturned() bool {
	if at.abandoned == nil || !at.taken.Slot() {
		return true
	}
	select {
	case <-at.abandoned:
		at.abandoned = nil
		return true
	case <-at.x.ctx.Done():
		return false
	}
}

// receipts takes what the attempt running records of its effect
// (Receipts): the port a handler's call.Receipt reaches the execution's
// record through, under the attempt's claim. attempt is the attempt whose
// handler may record a receipt (0: none), changed under mu, which a
// receipt's write holds: an attempt's end waits for a receipt being written
// (DESIGN §5). tried says the open attempt's handler wrote (or tried to
// write) a receipt: without one, the attempt's end does not read the claim,
// whose lock a lease renewal may hold.
type receipts struct {
	x       *execution
	mu      sync.Mutex
	attempt int
	tried   bool
}

// RecordReceipt stores receipt as attempt n's evidence of its effect, by
// compare-and-swap under the attempt's claim (Receipts). The receipt lock
// orders it with the end of the attempt: once the attempt has ended, its
// outcome is decided without the receipt, and the receipt is refused.
func (rc *receipts) RecordReceipt(ctx context.Context, n int, receipt envelope.Raw) error {
	x := rc.x
	if len(receipt) == 0 {
		return fmt.Errorf("%w: the receipt is empty", ErrReceiptRefused)
	}
	if len(receipt) > MaxReceipt {
		return fmt.Errorf("%w: the receipt is %d bytes, more than %d", ErrReceiptRefused, len(receipt), MaxReceipt)
	}
	hash, err := envelope.InputHash(receipt)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrReceiptRefused, err)
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.attempt != n {
		return fmt.Errorf("%w: attempt %d has ended", ErrReceiptRefused, n)
	}
	if x.unclaimed {
		return fmt.Errorf("%w: a read without a claim keeps no receipt", ErrReceiptRefused)
	}
	if x.claim.lapsed.Load() {
		// The lease ran out unrenewed: another worker may own the execution.
		return fmt.Errorf("%w: the attempt's lease was lost", ErrReceiptRefused)
	}
	rc.tried = true
	_, end := x.obs.Stage(ctx, observe.StageReceipt)
	err = x.claim.update(func(r *Record) {
		r.Receipt, r.ReceiptAttempt, r.ReceiptAt = receipt, n, x.w.now().UTC()
	})
	if errors.Is(err, errCancelRequested) {
		err = nil // written; the cancel came after the effect
	}
	end(err)
	switch {
	case errors.Is(err, errLost):
		return fmt.Errorf("%w: the attempt's claim was lost", ErrReceiptRefused)
	case err != nil:
		return fmt.Errorf("%w: %v", ErrReceiptRefused, err)
	}
	x.emit(audit.EventReceiptRecorded, map[string]any{"attempt": n, "receiptHash": hash, "bytes": len(receipt)})
	return nil
}

// open lets attempt n record receipts.
func (rc *receipts) open(n int) {
	rc.mu.Lock()
	rc.attempt, rc.tried = n, false
	rc.mu.Unlock()
}

// close ends attempt n's receipts and returns the one it recorded,
// nil for none: from here the attempt's outcome is decided. An attempt
// that wrote no receipt ends without reading the claim.
func (rc *receipts) close(n int) envelope.Raw {
	x := rc.x
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.attempt = 0
	if !rc.tried || x.claim.held() == nil {
		return nil
	}
	rec := x.claim.record()
	return receiptOf(&rec, n)
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
	returned := make(chan struct{})
	x.w.stats.handlerCalls.Add(1)
	x.lease.progress.begin(n)
	x.flight.calling.Store(true)
	x.flight.starting.Store(false) // after calling: a reader sees one or the other
	defer x.flight.calling.Store(false)
	defer x.lease.progress.end()
	a := Attempt{N: n, Key: x.idempotencyKey(), Logger: x.attemptLogger(n), Progress: &x.lease.progress, Receipts: &at.receipts}
	go func() {
		defer close(returned)
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
			at.abandoned = returned
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

// attemptLogger is the worker's logger with the attempt's execution,
// capability and number; the worker's own when it discards everything.
func (x *execution) attemptLogger(n int) *slog.Logger {
	if x.w.log.Handler() == slog.DiscardHandler {
		return x.w.log
	}
	return x.w.log.With("executionId", x.req.ExecutionID, "capabilityId", x.req.CapabilityID, "attempt", n)
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

// timeoutError is the error of an attempt the runtime stopped at its
// timeout. Of work that must not run twice, it is not retryable: the
// handler ran, and may have taken effect before it was stopped.
func (at *attempts) timeoutError() *envelope.CapabilityError {
	e := timeoutError(at.x.cap.Timeout())
	if !at.x.cap.Rerunnable() {
		e.Retryable = false
		e.Message += " It may have taken effect: check before calling it again."
	}
	return e
}

func (at *attempts) cancelledError() *envelope.CapabilityError {
	x := at.x
	msg := "The caller cancelled the execution."
	var oc *operatorCancel
	switch cause := context.Cause(x.ctx); {
	case errors.Is(cause, errDeadline):
		msg = "The request's deadline passed."
	case errors.As(cause, &oc):
		msg = "An operator paused this operation and cancelled the execution: " + oc.reason
	}
	return &envelope.CapabilityError{Code: envelope.CodeCancelled, Stage: envelope.StageCancelation, ExposeToModel: true, Message: msg}
}

// afterRun is the outcome of a last attempt that failed. A timeout is the
// runtime stopping the handler, as a cancel is: status cancelled, code
// TIMEOUT (retryable for the caller when the work may run twice), event
// capability.cancelled. A failure the handler reported is status failed,
// event capability.failed.
func afterRun(cerr *envelope.CapabilityError) *outcome {
	if cerr.Code == envelope.CodeTimeout && cerr.Stage == envelope.StageTimeout {
		return stopped(cerr)
	}
	return failedAfterRun(cerr)
}

// endByContext is how an execution whose whole context ended ends: left to
// the claim's new owner, given back on shutdown, otherwise cancelled.
func (at *attempts) endByContext(n int) Action {
	if a, ok := at.interrupted(n, ""); ok {
		return a
	}
	return Action{Do: Finish, Attempts: n, end: cancelled(envelope.CodeCancelled, at.cancelledError().Message)}
}

// interrupted is x.interrupted for an execution that ran n attempts. A read
// without a claim given back at its worker's shutdown after its handler ran
// files the events it held, so that the trail keeps the run its redelivery
// repeats; given back before any attempt, it files nothing.
func (at *attempts) interrupted(n int, during string) (Action, bool) {
	a, ok := at.x.interrupted(during)
	if ok && n > 0 && at.x.unclaimed {
		at.x.trail.flush()
	}
	return a, ok
}

// interrupted is the action for an execution whose context the claim's loss
// ended (none: it is left to the claim's new owner) or the worker's
// shutdown (Release), and whether one of them did. during, when set, is
// what the loss interrupted, for the log.
func (x *execution) interrupted(during string) (Action, bool) {
	switch cause := context.Cause(x.ctx); {
	case errors.Is(cause, errLeaseLost):
		if during != "" {
			x.w.log.Warn("claim lost: leaving the execution to its new owner", "during", during, "executionId", x.req.ExecutionID)
		}
		return Action{}, true
	case errors.Is(cause, errShutdown):
		return Action{Do: Release}, true
	}
	return Action{}, false
}
