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

// Receipts and reconcilers (DESIGN §5): how an attempt whose outcome was lost
// — its worker killed, or the attempt stopped after its effect — ends
// completed rather than OUTCOME_UNKNOWN, without ever running work that is
// not retried a second time on a guess. A receipt is evidence the handler
// records after its effect, on the record, under the attempt's claim; a
// reconciler asks the system where the effect lives. The takeover table
// (Takeover) decides from both; this file carries its decisions out.

// ErrReceiptRefused reports a receipt that was not recorded: the attempt had
// ended (its outcome decided without it), its claim was lost, or the store
// did not answer. The handler's result will not be used either way.
var ErrReceiptRefused = errors.New("capstan: receipt not recorded")

// MaxReceipt is the largest receipt a handler may record, encoded: a receipt
// rides every later write of the record (the lease's renewals).
const MaxReceipt = 8 << 10

// RecordReceipt stores receipt as attempt n's evidence of its effect, by
// compare-and-swap under the attempt's claim (Receipts). The receipt lock
// orders it with the end of the attempt: once the attempt has ended, its
// outcome is decided without the receipt, and the receipt is refused.
func (e *Execution) RecordReceipt(ctx context.Context, n int, receipt envelope.Raw) error {
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
	e.receiptMu.Lock()
	defer e.receiptMu.Unlock()
	if e.receiptOpen != n {
		return fmt.Errorf("%w: attempt %d has ended", ErrReceiptRefused, n)
	}
	if e.claim.lapsed.Load() {
		// The lease ran out unrenewed: another worker may own the execution.
		return fmt.Errorf("%w: the attempt's lease was lost", ErrReceiptRefused)
	}
	e.receiptTried = true
	_, end := e.obs.Stage(ctx, observe.StageReceipt)
	err = e.claim.update(func(r *Record) {
		r.Receipt, r.ReceiptAttempt, r.ReceiptAt = receipt, n, e.r.now().UTC()
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
	e.emit(audit.EventReceiptRecorded, map[string]any{"attempt": n, "receiptHash": hash, "bytes": len(receipt)})
	return nil
}

// openReceipts lets attempt n record receipts.
func (e *Execution) openReceipts(n int) {
	e.receiptMu.Lock()
	e.receiptOpen, e.receiptTried = n, false
	e.receiptMu.Unlock()
}

// closeReceipts ends attempt n's receipts and returns the one it recorded,
// nil for none: from here the attempt's outcome is decided. An attempt
// that wrote no receipt ends without reading the claim.
func (e *Execution) closeReceipts(n int) envelope.Raw {
	e.receiptMu.Lock()
	defer e.receiptMu.Unlock()
	e.receiptOpen = 0
	if !e.receiptTried || e.claim.held() == nil {
		return nil
	}
	rec := e.claim.record()
	return receiptOf(&rec, n)
}

// recover finalizes attempt n completed from what it left: its receipt, or
// out, what the reconciler found (how says which). Stages 12 and 13 apply to
// it as to a handler's output: nothing that fails them leaves the worker.
func (e *Execution) recover(how string, n int, receipt envelope.Raw, out any) {
	var err error
	if how == envelope.RecoveredByReceipt {
		out, err = e.fromReceipt(n, receipt)
	}
	if err != nil {
		e.finalize(failedAfterRun(&envelope.CapabilityError{Code: envelope.CodeOutputInvalid, Stage: envelope.StageOutput,
			ExposeToModel: true, Message: "The operation took effect, but its receipt could not be made its output; it was withheld.",
			Cause: err}), n)
		return
	}
	raw, oerr := e.unit.Output(out)
	if oerr != nil {
		e.finalize(failedAfterRun(oerr), n)
		return
	}
	o := completed(raw)
	o.env.Recovered = &envelope.Recovered{How: how, Attempt: n}
	o.data = map[string]any{"recovered": how, "recoveredAttempt": n}
	if how == envelope.RecoveredByReceipt {
		if h, err := envelope.InputHash(receipt); err == nil {
			o.data["receiptHash"] = h
		}
	}
	e.r.recovered.Add(1)
	e.finalize(o, n)
}

// fromReceipt is the capability's output for attempt n's receipt; a panic
// is an error.
func (e *Execution) fromReceipt(n int, receipt envelope.Raw) (out any, err error) {
	defer func() {
		if r := recover(); r != nil {
			out, err = nil, fmt.Errorf("FromReceipt panicked: %v", r)
		}
	}()
	ctx, cancel := context.WithTimeout(e.ctx, e.recoveryTimeout())
	defer cancel()
	return e.unit.FromReceipt(ctx, n, receipt)
}

// recoveryTimeout bounds one reconciliation, or one receipt's conversion.
func (e *Execution) recoveryTimeout() time.Duration {
	if t := e.cap.Recovery().Timeout; t > 0 {
		return t
	}
	return DefaultReconcileTimeout
}

// DefaultReconcileTimeout bounds a reconciliation unless the capability
// says otherwise.
const DefaultReconcileTimeout = 10 * time.Second

// admitted readmits a taken-over execution for what comes after its lost
// attempt (stage 5 again, the approval it consumed), and reports whether it
// may go on; when it may not, it has ended as the admission says.
func (e *Execution) admitted(n int) bool {
	if e.unit != nil {
		return true
	}
	adm := e.cap.Readmit(e.ctx, e.request())
	for _, ev := range adm.Events {
		e.emit(ev.Type, ev.Data)
	}
	switch {
	case adm.Stopped:
		e.endByContext(n)
		return false
	case adm.Refusal != nil:
		e.finalize(failed(adm.Refusal), n)
		return false
	case adm.Unit == nil:
		// An approval asked for again: a takeover never asks twice.
		e.finalize(failed(&envelope.CapabilityError{Code: envelope.CodeInternalError, Stage: envelope.StageHandler,
			Message: "The operation failed.", Cause: errors.New("readmission asked for an approval")}), n)
		return false
	}
	e.unit, e.adm = adm.Unit, adm
	return true
}

// recoverTaken finalizes a taken-over attempt n from its receipt.
func (e *Execution) recoverTaken(n int) {
	e.lease.start()
	rec := e.claim.record()
	receipt := receiptOf(&rec, n)
	if !e.admitted(n) {
		return
	}
	e.recover(envelope.RecoveredByReceipt, n, receipt, nil)
}

// reconcile asks the capability's reconciler whether the lost attempt n took
// effect, holding the record as reconciling{n} under this claim's lease (a
// worker lost meanwhile is taken over like an attempt), then carries out
// what the takeover table says of the answer.
func (e *Execution) reconcile(n int) {
	e.lease.start()
	if !e.admitted(n) {
		return
	}
	start := e.r.now()
	res := e.ask(n)
	data := map[string]any{"attempt": n, "verdict": res.Verdict.String(), "provesAbsence": e.cap.Recovery().ProvesAbsence,
		"durationMs": e.r.now().Sub(start).Milliseconds()}
	if res.Err != nil {
		data["reason"] = inconclusiveReason(res.Err)
		e.r.log.Warn("reconciler could not tell", "executionId", e.req.ExecutionID, "capabilityId", e.req.CapabilityID,
			"attempt", n, "err", res.Err)
	}
	switch cause := context.Cause(e.ctx); {
	case errors.Is(cause, errLeaseLost):
		e.r.log.Warn("claim lost during reconciliation: leaving the execution to its new owner", "executionId", e.req.ExecutionID)
		return
	case errors.Is(cause, errShutdown):
		e.release()
		return
	}
	e.emit(audit.EventReconciled, data)
	if e.ctx.Err() != nil && res.Verdict != Found {
		e.endByContext(n)
		return
	}
	held := e.claim.record()
	f := e.facts(&held, EnvelopeNotRead)
	f.Claimed, f.Reconciled = true, res.Verdict
	switch a := Takeover(f); a.Do {
	case Recover:
		e.recover(a.How, n, nil, res.Output)
	case Retry:
		e.retryReason = a.Reason
		e.run(false, a.Attempts, envelope.CodeWorkerLost)
	case Cancel:
		e.finalize(cancelled(envelope.CodeCancelled, "The caller cancelled the execution."), a.Attempts)
	case Fail:
		e.finalize(afterRun(a.Err), a.Attempts)
	default:
		// Nothing else follows an answer: leave it to the next delivery.
		e.r.log.Error("takeover table: no action after a reconciliation", "executionId", e.req.ExecutionID, "do", a.Do)
		e.release()
	}
}

// ask calls the reconciler once under its timeout and the execution's
// context. A panic, an error, or the time running out are Inconclusive.
func (e *Execution) ask(n int) Reconciliation {
	ctx, cancel := context.WithTimeoutCause(e.ctx, e.recoveryTimeout(), errReconcileTimeout)
	defer cancel()
	ctx, end := e.obs.Stage(ctx, observe.StageReconcile)
	key := e.idempotencyKey() // the lost attempt's: the record names it
	ch := make(chan Reconciliation, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				ch <- Reconciliation{Verdict: Inconclusive, Err: fmt.Errorf("%w: %v\n%s", errReconcilePanic, r, debug.Stack())}
			}
		}()
		ch <- e.unit.Reconcile(ctx, n, key)
	}()
	var res Reconciliation
	select {
	case res = <-ch:
	case <-ctx.Done():
		select {
		case res = <-ch:
		default:
			res = Reconciliation{Verdict: Inconclusive, Err: context.Cause(ctx)}
		}
	}
	switch {
	case res.Verdict == Found || res.Verdict == Absent:
		if ctx.Err() != nil && res.Err == nil && res.Verdict == Absent {
			// An absence told after the reconciliation's time ran out proves
			// nothing: the reconciler may have been cut off.
			res = Reconciliation{Verdict: Inconclusive, Err: context.Cause(ctx)}
		}
	case res.Err == nil:
		res = Reconciliation{Verdict: Inconclusive, Err: errReconcileUnknown}
	default:
		res.Verdict = Inconclusive
	}
	end(res.Err)
	return res
}

// Why a reconciliation was inconclusive.
var (
	errReconcileTimeout = errors.New("the reconciliation timed out")
	errReconcilePanic   = errors.New("the reconciler panicked")
	errReconcileUnknown = errors.New("the reconciler could not tell")
)

// inconclusiveReason names err for the trail: the kind of failure, never its
// text (which may carry data).
func inconclusiveReason(err error) string {
	switch {
	case errors.Is(err, errReconcileTimeout):
		return "timeout"
	case errors.Is(err, errReconcilePanic):
		return "panic"
	case errors.Is(err, errReconcileUnknown):
		return "unknown"
	case errors.Is(err, errCallerCancelled), errors.Is(err, errDeadline):
		return "cancelled"
	}
	return "error"
}
