package engine

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/limits"
)

// Limits (DESIGN §17): an admitted execution takes the limits its
// admission lists before its first attempt, and gives its slot back when its
// run ends. An execution of a capability without limits never comes here.

// waitsFiled remembers the executions whose wait at a limit this worker put
// on the trail lately, by execution and limit. A waiting request comes back
// every few seconds until its start deadline (a day by default); its trail
// says capability.limited once every refileWait, not at each return, so that
// a principal's queue of waiting requests does not fill the shared audit
// stream.
type waitsFiled struct {
	mu     sync.Mutex
	at     map[string]time.Time
	pruned time.Time // when the entries past refileWait were last let go
}

const (
	// refileWait is how often one execution's wait goes on the trail again.
	refileWait = 5 * time.Minute
	// mostWaitsFiled bounds what a worker remembers: past it (every entry
	// recent), each wait is filed as it comes.
	mostWaitsFiled = 100_000
)

// first reports whether the wait of key at now is not on the trail from
// this worker within refileWait, and remembers it filed at now.
func (f *waitsFiled) first(key string, now time.Time) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if at, ok := f.at[key]; ok && now.Sub(at) < refileWait {
		return false
	}
	if f.at == nil {
		f.at = map[string]time.Time{}
	}
	if len(f.at) >= mostWaitsFiled || now.Sub(f.pruned) >= refileWait {
		for k, at := range f.at {
			if now.Sub(at) >= refileWait {
				delete(f.at, k)
			}
		}
		f.pruned = now
		if len(f.at) >= mostWaitsFiled {
			return true
		}
	}
	f.at[key] = now
	return true
}

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

// SweepSlots frees the slots whose holders are gone by their records though
// no execution asked for them (limits.Store.Sweep): a killed worker's
// slot of a principal or actor that never calls again. It reports how many
// it freed.
func (r *Runner) SweepSlots(ctx context.Context) (int, error) {
	if r.w.limits == nil {
		return 0, nil
	}
	return r.w.limits.Sweep(ctx)
}
