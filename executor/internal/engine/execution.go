package engine

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/broker"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/limits"
	"github.com/capstan-dev/capstan/observe"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
)

// Execution is one delivery of one request being worked on by this worker.
type Execution struct {
	r   *Runner
	msg jetstream.Msg
	req *envelope.Request
	// principal is the token of the subject the server accepted the request
	// on: who sent it, whatever the body says. key is the execution's key in
	// the executions and envelopes buckets.
	principal, key string
	// subjectCapability is the capability id of the subject, "" for _unrouted.
	subjectCapability string
	cap               Definition // nil when no pool serves the capability
	obs               observe.Execution
	// missing says why cap is nil: "unknown", "invalid-id".
	missing string
	// delivery is what the message's metadata says of this delivery.
	delivery Delivery
	// unproven: this delivery found no record, and that did not prove that
	// no attempt had started (AbsenceProves).
	unproven bool
	// unit runs the attempts, once stages 4 to 9 let the execution through.
	unit WorkUnit

	// ctx spans the whole execution: the caller's cancel and deadline, a lost
	// claim, the worker's shutdown. Each attempt adds its own timeout.
	ctx          context.Context
	cancel       context.CancelCauseFunc
	stopDeadline context.CancelFunc

	// claim holds the execution's record; lease keeps it while it runs,
	// and takes what its attempts report of their progress; trail files its
	// audit events.
	claim claim
	lease leaseKeeper
	trail trail

	start     time.Time
	inputHash string
	done      chan struct{}

	// adm is the admission that let the execution through: the limits it
	// takes (DESIGN §17).
	adm Admission
	// taken is what the execution took of its limits.
	taken limits.Taken

	// found is the record a create of this delivery found in its place:
	// another claim's, or a cancel's. The takeover table decides from it.
	found    *Record
	foundRev uint64

	// receiptOpen is the attempt whose handler may record a receipt (0:
	// none), changed under receiptMu, which a receipt's write holds: an
	// attempt's end waits for a receipt being written (DESIGN §5).
	// receiptTried says the open attempt's handler wrote (or tried to
	// write) a receipt: without one, the attempt's end does not read the
	// claim, whose lock a lease renewal may hold.
	receiptMu    sync.Mutex
	receiptOpen  int
	receiptTried bool
	// retryReason is why the next attempt starts when it is not the retry
	// rule (ReasonReconciledAbsent): audited, and counted on the record.
	retryReason string
}

// bare is an execution of req, delivered by msg (nil: none) under
// principal, that may only end without running: its record, trail and
// envelope, no lease.
func (r *Runner) bare(msg jetstream.Msg, req *envelope.Request, principal string) *Execution {
	d := Delivery{ID: req.ExecutionID, StartBy: req.StartBy}
	if msg != nil {
		d = delivered(msg, req)
	}
	return r.execution(msg, req, principal, d)
}

// execution is an execution of req, delivered by msg (nil: none) as d,
// under principal, with its claim (not made yet) and its trail.
func (r *Runner) execution(msg jetstream.Msg, req *envelope.Request, principal string, d Delivery) *Execution {
	x := &Execution{r: r, msg: msg, req: req, principal: principal, key: broker.Key(principal, req.ExecutionID),
		delivery: d, start: r.now(), done: make(chan struct{}), stopDeadline: func() {}}
	x.trail.audit, x.trail.worker = r.audit, r.cfg.ID
	x.claim.s, x.claim.key, x.claim.token = r.store, x.key, uuid.NewString()
	x.lease.progress.x = x
	return x
}

// newExecution is an execution of req, delivered by msg as d, of the
// capability c (nil: none served here).
func (r *Runner) newExecution(msg jetstream.Msg, req *envelope.Request, d Delivery, c Definition) *Execution {
	principal, subjectCapability := broker.Anonymous, ""
	if msg != nil {
		if p, capID, ok := r.b.Names.ParseExecSubject(msg.Subject()); ok {
			principal = p
			if capID != broker.Unrouted {
				subjectCapability = capID
			}
		}
	}
	x := r.execution(msg, req, principal, d)
	x.cap, x.subjectCapability = c, subjectCapability
	ctx, obs := r.cfg.Observer.Begin(r.base, r.observed(d, req, c != nil))
	x.obs = obs
	x.ctx, x.cancel = context.WithCancelCause(ctx)
	if req.Deadline != nil {
		x.ctx, x.stopDeadline = context.WithDeadlineCause(x.ctx, *req.Deadline, errDeadline)
	}
	l := &x.lease
	l.claim, l.length, l.disabled, l.now, l.msg = &x.claim, r.cfg.Lease, r.cfg.DisableLeaseRenewal, r.now, msg
	l.end, l.done, l.log, l.id, l.stop = x.cancel, x.done, r.log, req.ExecutionID, make(chan struct{})
	return x
}

// event is an audit event of the execution.
func (e *Execution) event(typ string, data map[string]any) *audit.Event {
	return &audit.Event{
		Type: typ, Surface: e.req.Surface, Actor: audit.ActorOf(e.req.Actor), Principal: e.principal, ExecutionID: e.req.ExecutionID,
		CapabilityID: e.req.CapabilityID, CorrelationID: e.req.CorrelationID, InputHash: e.inputHash, Data: data,
		TraceID: audit.TraceID(e.req.Traceparent),
	}
}

// observed is what the observer is told of a delivery d of req.
func (r *Runner) observed(d Delivery, req *envelope.Request, known bool) observe.Delivery {
	return observe.Delivery{Request: req, Pool: r.cfg.Pool, Worker: r.cfg.ID, Known: known, Deliveries: d.Deliveries,
		Stored: d.Stored}
}

// stage tells the observer that a stage doing I/O starts (observe.Stage*);
// the returned func ends it.
func (e *Execution) stage(name string) func(error) {
	_, end := e.obs.Stage(e.ctx, name)
	return end
}

// emit files an audit event of the execution.
func (e *Execution) emit(typ string, data map[string]any) { e.trail.publish(e.event(typ, data)) }

// hashInput sets the input hash events carry in place of the input (SI-10).
func (e *Execution) hashInput() {
	if h, err := envelope.InputHash(e.req.Input); err == nil {
		e.inputHash = h
	}
}

// envelope reads the execution's envelope: nil, nil when there is none.
func (e *Execution) envelope() (*envelope.Envelope, error) { return e.r.store.envelope(e.key) }

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
		e.emit(audit.EventRequested, nil)
	}
	if e.ctx.Err() != nil {
		e.endByContext(0)
		return
	}
	// 3–9 ran before any attempt started; a takeover of a running execution
	// only needs the input back, and the approval it consumed.
	// (A reconciliation readmitted it already.)
	if e.unit == nil {
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
			e.finalize(failed(adm.Refusal), attempts)
			return
		case adm.Approval != nil:
			e.awaitApproval(adm.Approval)
			return
		}
		e.unit, e.adm = adm.Unit, adm
	}
	if len(e.adm.Limits) > 0 {
		if !e.takeLimits(e.adm, fromAttempt) {
			return
		}
		defer e.releaseLimits()
	}

	// 10–11: controls and the attempts.
	attempt := fromAttempt
	if attempt == 0 {
		attempt = 1
	} else {
		data := map[string]any{"attempt": attempt, "previousErrorCode": string(prevCode)}
		if e.retryReason != "" {
			data["reason"] = e.retryReason
		}
		e.emit(audit.EventRetried, data)
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
			reattempt := e.retryReason == ReasonReconciledAbsent
			err := e.claim.update(func(r *Record) {
				now := e.r.now().UTC()
				r.State, r.Attempt, r.StartedAt, r.LastError = StateRunning, attempt, now, ""
				r.LeaseUntil = now.Add(e.r.cfg.Lease) // a full lease for the attempt that starts
				// What a lost attempt before it left is its own.
				r.Receipt, r.ReceiptAttempt, r.ReceiptAt, r.Reconciliations = nil, 0, time.Time{}, 0
				if reattempt {
					r.Reattempts++
				}
				r.Progress = nil // the last attempt's
			})
			e.retryReason = ""
			endStart(err)
			if err != nil {
				e.endByRecord(err, attempt-1)
				return
			}
		}
		started := e.event(audit.EventStarted, e.unit.Started(attempt))
		if e.r.cfg.StrictAudit {
			endAudit := e.stage(observe.StageAudit)
			err := e.trail.flushSync(e.ctx, started)
			endAudit(err)
			if err != nil {
				if e.ctx.Err() != nil {
					e.endByContext(attempt - 1)
					return
				}
				e.finalize(failed(&envelope.CapabilityError{Code: envelope.CodeAuditUnavailable, Stage: envelope.StageControls,
					Retryable: true, ExposeToModel: true, Message: "The audit trail is unavailable; the operation was not run.", Cause: err}),
					attempt-1)
				return
			}
		} else {
			e.trail.publish(started)
			e.trail.flushSoon()
		}

		out, cerr, receipt := e.attempt(attempt, c.Timeout())
		if cerr == nil {
			// 12–13: the output's validation, redaction and encoding.
			raw, oerr := e.unit.Output(out)
			if oerr != nil {
				e.finalize(failedAfterRun(oerr), attempt)
				return
			}
			e.finalize(completed(raw), attempt)
			return
		}
		switch cause := context.Cause(e.ctx); {
		case errors.Is(cause, errLeaseLost):
			e.r.log.Warn("claim lost during the attempt: leaving the execution to its new owner", "executionId", e.req.ExecutionID)
			return
		case errors.Is(cause, errShutdown):
			e.release()
			return
		case receipt != nil && stoppedByRuntime(cerr):
			// Stopped (its timeout, the caller's cancel) after it recorded
			// that its effect happened: it completed (DESIGN §5).
			e.recover(envelope.RecoveredByReceipt, attempt, receipt, nil)
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
			e.emit(audit.EventRetried, map[string]any{"attempt": attempt, "previousErrorCode": string(cerr.Code)})
			e.obs.Retried(attempt, cerr.Code)
			continue
		}
		e.finalize(afterRun(cerr), attempt)
		return
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
func (e *Execution) attempt(n int, timeout time.Duration) (_ any, _ *envelope.CapabilityError, receipt envelope.Raw) {
	e.openReceipts(n)
	out, cerr := e.call(n, timeout)
	return out, cerr, e.closeReceipts(n)
}

// call is attempt's call of the handler.
func (e *Execution) call(n int, timeout time.Duration) (_ any, cerr *envelope.CapabilityError) {
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
	e.lease.progress.begin(n)
	defer e.lease.progress.end()
	a := Attempt{N: n, Key: e.idempotencyKey(), Logger: e.r.log.With("executionId", e.req.ExecutionID, "capabilityId", e.req.CapabilityID, "attempt", n),
		Progress: &e.lease.progress, Receipts: e}
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
func afterRun(cerr *envelope.CapabilityError) *outcome {
	if cerr.Code == envelope.CodeTimeout && cerr.Stage == envelope.StageTimeout {
		return stopped(cerr)
	}
	return failedAfterRun(cerr)
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
	e.finalize(cancelled(envelope.CodeCancelled, e.cancelledError().Message), attempts)
}

// endByRecord handles a failed record update.
func (e *Execution) endByRecord(err error, attempts int) {
	if errors.Is(err, errCancelRequested) {
		e.finalize(cancelled(envelope.CodeCancelled, "The caller cancelled the execution."), attempts)
		return
	}
	// Lost: another worker owns it. Unsettled: the store did not answer; the
	// redelivery decides once the lease has run out.
	e.r.log.Warn("execution record not updated: leaving the execution", "executionId", e.req.ExecutionID, "err", err)
}

// release gives the execution back on shutdown: the lease ends now and the
// message is redelivered at once, so a live worker takes it over.
func (e *Execution) release() {
	e.releaseThen(false, func() { _ = e.msg.Nak() })
}

// releaseThen gives the execution back, its lease ended now, and then has
// the delivery redelivered as redeliver says; nothing claimed yet, the held
// trail is dropped first. A claim another worker took keeps its delivery.
// Waiting (for a limit), the record names no worker any more: the delivery
// that comes back resumes it rather than taking it over from a worker that
// was not lost.
func (e *Execution) releaseThen(waiting bool, redeliver func()) {
	if e.claim.held() == nil {
		e.trail.drop()
		redeliver()
		return
	}
	e.lease.halt()
	if err := e.claim.update(func(r *Record) {
		r.LeaseUntil = e.r.now().UTC()
		if waiting {
			r.Worker = ""
		}
	}); errors.Is(err, errLost) {
		return // another worker owns it, and its delivery
	}
	redeliver()
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
		e.finalize(failed(cerr), 0)
		return
	}
	e.finalize(approvalRequired(ref, data), 0)
}

// idempotencyKey is the key the execution's attempts and reconciliations
// are given: the derivation its record names, fixed when the record was
// created (an execution begun by an earlier version keeps the id-alone key
// its record implies), and this version's before any record exists.
func (e *Execution) idempotencyKey() string {
	if rec := e.claim.held(); rec != nil {
		return rec.IdempotencyKey(e.principal)
	}
	return envelope.IdempotencyKey(e.principal, e.req.ExecutionID)
}

// request is what the stages see of the execution.
func (e *Execution) request() Request {
	r := Request{Request: e.req, Principal: e.principal, SubjectCapability: e.subjectCapability, Observer: e.obs}
	if rec := e.claim.held(); rec != nil {
		r.RecordCreated = rec.CreatedAt
	}
	return r
}

// trail files an execution's audit events (DESIGN §8). While it holds them,
// they are kept and published together, as one message: before the claim
// (they are dropped if the claim finds another record, whose execution has
// its own trail), and for a short while after the attempt starts, so that an
// execution that ends quickly is one message on the trail (DESIGN §14).
// Events reach the emitter under the trail's lock, so that they reach the
// stream in the order they were filed, whoever flushes.
type trail struct {
	audit  *audit.Emitter
	worker string

	mu      sync.Mutex
	held    []*audit.Event
	holding bool
	timer   *time.Timer
}

// holdEvents is how long an attempt's first events wait for its end, to be
// published with it as one message.
const holdEvents = 20 * time.Millisecond

// publish files ev: kept while the trail holds its events, published at
// once otherwise.
func (t *trail) publish(ev *audit.Event) {
	ev.Worker = t.worker
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.holding {
		t.held = append(t.held, ev)
		return
	}
	t.audit.Emit(ev)
}

// hold starts keeping the events.
func (t *trail) hold() {
	t.mu.Lock()
	t.holding = true
	t.mu.Unlock()
}

// flush ends holding: what was kept is published as one message, then
// every later event at once.
func (t *trail) flush() {
	t.mu.Lock()
	defer t.mu.Unlock()
	evs := t.held
	t.held, t.holding = nil, false
	if t.timer != nil {
		t.timer.Stop()
	}
	if len(evs) > 0 {
		t.audit.EmitAll(evs...)
	}
}

// flushSync is flush with ev added, acknowledged by JetStream before it
// returns (strict audit).
func (t *trail) flushSync(ctx context.Context, ev *audit.Event) error {
	ev.Worker = t.worker
	t.mu.Lock()
	defer t.mu.Unlock()
	evs := append(t.held, ev)
	t.held, t.holding = nil, false
	if t.timer != nil {
		t.timer.Stop()
	}
	return t.audit.EmitAllSync(ctx, evs...)
}

// drop forgets what is held: the claim found another record.
func (t *trail) drop() {
	t.mu.Lock()
	t.held, t.holding = nil, false
	t.mu.Unlock()
}

// flushSoon publishes what is held after holdEvents, unless the execution
// ends first and publishes it with its terminal event.
func (t *trail) flushSoon() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.holding && t.timer == nil {
		t.timer = time.AfterFunc(holdEvents, t.flush)
	}
}
