package engine

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/broker"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/limits"
)

// Limits (DESIGN §17): an admitted execution takes the limits its
// admission lists before its first attempt, and gives its slot back when its
// run ends. An execution of a capability without limits never comes here.

// holderAlive judges a slot's holder whose lease, as recorded in the slots,
// has passed: by its execution's record, the truth of its lease.
func (r *Runner) holderAlive(_ context.Context, h limits.Holder) (limits.Verdict, error) {
	rec, _, err := r.store.load(h.Key)
	switch {
	case err == nil:
		return limits.HolderAlive(h, true, rec.Claim, rec.State == StateFinalized, rec.LeaseUntil, r.now()), nil
	case errors.Is(err, broker.ErrNotFound):
		return limits.HolderAlive(h, false, "", false, time.Time{}, r.now()), nil
	}
	return limits.Verdict{}, err
}

// takeLimits takes the execution's limits and reports whether its attempts
// may start. When they may not, it has carried out the capability's choice
// at the limit: the delivery waits (a later delivery tries again, until the
// start deadline), the execution ends RATE_LIMITED, or it asks for an
// approval. A takeover (fromAttempt > 0) takes its slot again under its own
// claim and nothing else: its rates and budgets were taken when it first
// started; over the slots it waits, whatever the choice, since an attempt
// may have run.
func (e *Execution) takeLimits(adm Admission, fromAttempt int) bool {
	lims := adm.Limits
	if fromAttempt > 0 {
		// Readmit carries the concurrency limits alone; any other is
		// dropped here all the same.
		if slices.ContainsFunc(lims, func(l limits.Limit) bool { return l.Kind != limits.Concurrency }) {
			lims = slices.DeleteFunc(slices.Clone(lims), func(l limits.Limit) bool { return l.Kind != limits.Concurrency })
		}
		if len(lims) == 0 {
			return true
		}
	}
	if e.r.limits == nil {
		e.waitForLimit(time.Second)
		return false
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
	h := limits.Holder{Key: e.key, Claim: e.claim.token, Until: e.r.now().UTC().Add(e.r.cfg.Lease), Worker: e.r.cfg.ID}
	taken, over, err := e.r.limits.Take(e.ctx, lims, h, approved)
	if err != nil {
		if e.ctx.Err() != nil {
			e.endByContext(0)
			return false
		}
		e.r.log.Warn("limits not taken: the delivery waits", "executionId", e.req.ExecutionID, "err", err)
		e.waitForLimit(time.Second)
		return false
	}
	if over == nil {
		e.taken = taken
		if taken.Slot() {
			e.obs.Slot(true)
		}
		return true
	}
	action := over.Limit.Action
	if fromAttempt > 0 || (action == limits.Approve && adm.OverBudget == nil) {
		action = limits.Wait
		if fromAttempt == 0 {
			action = limits.Refuse
		}
	}
	e.r.limited.Add(1)
	e.obs.Limited(string(over.Limit.Kind), string(action))
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
	// Outside the held trail: a wait drops what it holds.
	e.r.emit(e.event(audit.EventLimited, data))
	switch action {
	case limits.Refuse:
		e.finalize(failed(RateLimitedError(*over)), 0)
	case limits.Approve:
		e.awaitApproval(adm.OverBudget(over.Limit.String()))
	default:
		e.waitForLimit(limits.WaitFor(over.RetryAfter, e.delivery.Deliveries, rand.Float64()))
	}
	return false
}

// waitForLimit leaves the delivery for a later one, after delay, or at the
// request's start deadline if that comes first (then it ends NOT_STARTED).
// A claim this delivery holds is given up first.
func (e *Execution) waitForLimit(delay time.Duration) {
	if sb := e.req.StartBy; sb != nil {
		delay = min(delay, max(sb.Sub(e.r.now())+10*time.Millisecond, 0))
	}
	e.releaseThen(true, func() { nak(e.msg, delay) })
}

// releaseLimits gives back the slot the execution took, if any: its run has
// ended (finalized, lost to another claim, or left for later).
func (e *Execution) releaseLimits() {
	if !e.taken.Slot() {
		return
	}
	ctx, cancel := StoreContext()
	defer cancel()
	e.r.limits.Release(ctx, e.taken)
	e.taken = limits.Taken{}
	e.obs.Slot(false)
}

// RateLimitedError is the refusal of a call over a limit whose choice is to
// refuse: exposed to the model, with when to try again.
func RateLimitedError(over limits.Over) *envelope.CapabilityError {
	msg := "A limit of this operation was reached (" + over.Limit.String() + "); it was not run."
	details := map[string]any{"limit": over.Limit.String()}
	if over.RetryAfter > 0 {
		msg += " Try again in " + roundUp(over.RetryAfter).String() + "."
		details["retryAfterMs"] = over.RetryAfter.Milliseconds()
	} else if over.Limit.Kind == limits.Budget && over.Limit.Amount > over.Limit.Max {
		msg += " The amount alone is over the limit."
	} else {
		msg += " Try again later."
	}
	return &envelope.CapabilityError{Code: envelope.CodeRateLimited, Stage: envelope.StageLimits, ExposeToModel: true,
		Retryable: over.RetryAfter > 0 || over.Limit.Kind != limits.Budget, Message: msg, Details: details}
}

// roundUp rounds a wait up to what a person reads: whole seconds, or
// tenths under a second.
func roundUp(d time.Duration) time.Duration {
	unit := time.Second
	if d < time.Second {
		unit = 100 * time.Millisecond
	}
	return (d + unit - 1).Truncate(unit)
}
