package engine

import (
	"context"
	"errors"
	"time"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/broker"
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
