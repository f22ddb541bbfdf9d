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
func (w *worker) holderAlive(_ context.Context, h limits.Holder) (limits.Verdict, error) {
	rec, _, err := w.store.load(h.Key)
	switch {
	case err == nil:
		return limits.HolderAlive(h, true, rec.Claim, rec.State == StateFinalized, rec.LeaseUntil, w.now()), nil
	case errors.Is(err, broker.ErrNotFound):
		return limits.HolderAlive(h, false, "", false, time.Time{}, w.now()), nil
	}
	return limits.Verdict{}, err
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
	// Outside the held trail: a wait drops what it holds.
	x.w.emit(x.event(audit.EventLimited, data))
	switch action {
	case limits.Refuse:
		return Action{Do: Finish, end: failed(RateLimitedError(*over))}, false
	case limits.Approve:
		return Action{Do: AwaitApproval, need: adm.OverBudget(over.Limit.String())}, false
	}
	return at.waitForLimit(limits.WaitFor(over.RetryAfter, x.meta.Deliveries, rand.Float64())), false
}

// waitForLimit leaves the delivery for a later one, after delay, or at the
// request's start deadline if that comes first (then it ends NOT_STARTED).
// A claim this delivery holds is given up first (Wait).
func (at *attempts) waitForLimit(delay time.Duration) Action {
	x := at.x
	if sb := x.req.StartBy; sb != nil {
		delay = min(delay, max(sb.Sub(x.w.now())+10*time.Millisecond, 0))
	}
	return Action{Do: Wait, Delay: delay, limit: true}
}

// releaseLimits gives back the slot the execution took, if any: its
// delivery has ended (finalized, lost to another claim, or left for later).
func (at *attempts) releaseLimits() {
	x := at.x
	if !at.taken.Slot() {
		return
	}
	ctx, cancel := StoreContext()
	defer cancel()
	x.w.limits.Release(ctx, at.taken)
	at.taken = limits.Taken{}
	x.obs.Slot(false)
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
