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

// recover ends attempt a.Attempts completed from what it left (Recover):
// its receipt, or what the reconciler found (a.How says which). Stages 12
// and 13 apply to it as to a handler's output: nothing that fails them
// leaves the worker.
func (at *attempts) recover(a Action) Action {
	x := at.x
	n := a.Attempts
	x.lease.start()
	var receipt envelope.Raw
	if a.How == envelope.RecoveredByReceipt {
		rec := x.claim.record()
		receipt = receiptOf(&rec, n)
	}
	if end, ok := at.admitted(n); !ok {
		return end
	}
	out, err := at.answer, error(nil)
	if a.How == envelope.RecoveredByReceipt {
		out, err = at.fromReceipt(n, receipt)
	}
	if err != nil {
		return Action{Do: Finish, Attempts: n, end: failedAfterRun(&envelope.CapabilityError{Code: envelope.CodeOutputInvalid,
			Stage: envelope.StageOutput, ExposeToModel: true,
			Message: "The operation took effect, but its receipt could not be made its output; it was withheld.", Cause: err})}
	}
	raw, oerr := at.unit.Output(out)
	if oerr != nil {
		return Action{Do: Finish, Attempts: n, end: failedAfterRun(oerr)}
	}
	o := completed(raw)
	o.env.Recovered = &envelope.Recovered{How: a.How, Attempt: n}
	o.data = map[string]any{"recovered": a.How, "recoveredAttempt": n}
	if a.How == envelope.RecoveredByReceipt {
		if h, err := envelope.InputHash(receipt); err == nil {
			o.data["receiptHash"] = h
		}
	}
	x.w.stats.recovered.Add(1)
	return Action{Do: Finish, Attempts: n, end: o}
}

// fromReceipt is the capability's output for attempt n's receipt; a panic
// is an error.
func (at *attempts) fromReceipt(n int, receipt envelope.Raw) (out any, err error) {
	x := at.x
	defer func() {
		if r := recover(); r != nil {
			out, err = nil, fmt.Errorf("FromReceipt panicked: %v", r)
		}
	}()
	ctx, cancel := context.WithTimeout(x.ctx, at.recoveryTimeout())
	defer cancel()
	return at.unit.FromReceipt(ctx, n, receipt)
}

// recoveryTimeout bounds one reconciliation, or one receipt's conversion.
func (at *attempts) recoveryTimeout() time.Duration {
	x := at.x
	if t := x.cap.Recovery().Timeout; t > 0 {
		return t
	}
	return DefaultReconcileTimeout
}

// DefaultReconcileTimeout bounds a reconciliation unless the capability
// says otherwise.
const DefaultReconcileTimeout = 10 * time.Second

// admitted readmits a taken-over execution for what comes after its lost
// attempt (stage 5 again, the approval it consumed), and reports whether it
// may go on; when it may not, it returns how it ends, as the admission says.
func (at *attempts) admitted(n int) (Action, bool) {
	x := at.x
	if at.unit != nil {
		return Action{}, true
	}
	adm := x.cap.Readmit(x.ctx, x.request())
	for _, ev := range adm.Events {
		x.emit(ev.Type, ev.Data)
	}
	switch {
	case adm.Stopped:
		return at.endByContext(n), false
	case adm.Refusal != nil:
		return Action{Do: Finish, Attempts: n, end: failed(adm.Refusal)}, false
	case adm.Unit == nil:
		// An approval asked for again: a takeover never asks twice.
		return Action{Do: Finish, Attempts: n, end: failed(&envelope.CapabilityError{Code: envelope.CodeInternalError,
			Stage: envelope.StageHandler, Message: "The operation failed.",
			Cause: errors.New("readmission asked for an approval")})}, false
	}
	at.unit, at.adm = adm.Unit, adm
	return Action{}, true
}

// reconcile asks the capability's reconciler whether the lost attempt n took
// effect (Reconcile), holding the record as reconciling{n} under this
// claim's lease (a worker lost meanwhile is taken over like an attempt),
// and returns what the takeover table says of the answer.
func (at *attempts) reconcile(n int) Action {
	x := at.x
	x.lease.start()
	if end, ok := at.admitted(n); !ok {
		return end
	}
	start := x.w.now()
	res := at.ask(n)
	data := map[string]any{"attempt": n, "verdict": res.Verdict.String(), "provesAbsence": x.cap.Recovery().ProvesAbsence,
		"durationMs": x.w.now().Sub(start).Milliseconds()}
	if res.Err != nil {
		data["reason"] = inconclusiveReason(res.Err)
		x.w.log.Warn("reconciler could not tell", "executionId", x.req.ExecutionID, "capabilityId", x.req.CapabilityID,
			"attempt", n, "err", res.Err)
	}
	if a, ok := x.interrupted("reconciliation"); ok {
		return a
	}
	x.emit(audit.EventReconciled, data)
	at.answer = res.Output
	held := x.claim.record()
	f := x.facts(&held, EnvelopeNotRead)
	f.Claimed, f.Reconciled = true, res.Verdict
	a := Takeover(f)
	if x.ctx.Err() != nil && a.Do != Recover && a.Do != Cancel {
		// Cancelled (by its caller, an operator or its deadline) while the
		// reconciler was asked: it ends so, saying whether the lost attempt
		// may have taken effect.
		end := at.endByContext(n)
		if end.Do == Finish && !f.provedAbsent() {
			cerr := at.cancelledError()
			cerr.Message += " " + lostAttemptMayHaveRun
			end.end = stopped(cerr)
		}
		return end
	}
	return a
}

// lostAttemptMayHaveRun ends the message of an execution cancelled once its
// attempt was lost with its worker, where nothing proved that it did not
// take effect: the cancel stopped nothing.
const lostAttemptMayHaveRun = "Its attempt had started on a worker that was lost: it may have taken effect."

// ask calls the reconciler once under its timeout and the execution's held
// context, which no cancel or deadline ends: the answer decides what the
// envelope says of the lost attempt, which no cancel stops. The claim's loss
// and the worker's shutdown end it, a cancel before them or not. A panic, an
// error, or the time running out are Inconclusive.
func (at *attempts) ask(n int) Reconciliation {
	x := at.x
	ctx, cancel := context.WithTimeoutCause(x.held, at.recoveryTimeout(), errReconcileTimeout)
	defer cancel()
	ctx, end := x.obs.Stage(ctx, observe.StageReconcile)
	key := x.idempotencyKey() // the lost attempt's: the record names it
	ch := make(chan Reconciliation, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				ch <- Reconciliation{Verdict: Inconclusive, Err: fmt.Errorf("%w: %v\n%s", errReconcilePanic, r, debug.Stack())}
			}
		}()
		ch <- at.unit.Reconcile(ctx, n, key)
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
