package executor

import (
	"log/slog"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/envelope"
)

// The retry rule as the engine asks it (DESIGN §6, SI-11): attempt n, failed
// with err, is followed by attempt n+1 only when the error is retryable, the
// side effect allows it (none, read, or declared idempotent), RetryOn does
// not veto it, and attempts are left; then after the backoff, doubling from
// Retry.Backoff. Every row without a server.
func TestSI11_RetryRuleWithItsAttemptBound(t *testing.T) {
	t.Parallel()
	timeout := &envelope.CapabilityError{Code: envelope.CodeTimeout, Retryable: true}
	failed := &envelope.CapabilityError{Code: envelope.CodeExecutionFailed}
	lost := &envelope.CapabilityError{Code: envelope.CodeWorkerLost, Retryable: true}
	retry := func(max int) *Retry { return &Retry{MaxAttempts: max, Backoff: 10 * time.Millisecond} }
	for _, tc := range []struct {
		name  string
		meta  Meta
		n     int
		err   *envelope.CapabilityError
		ok    bool
		pause time.Duration
	}{
		{"a read, attempt 1 timed out, 2 retries", Meta{SideEffect: SideEffectRead, Retry: retry(2)}, 1, timeout, true, 10 * time.Millisecond},
		{"a read, attempt 2 timed out, 2 retries", Meta{SideEffect: SideEffectRead, Retry: retry(2)}, 2, timeout, true, 20 * time.Millisecond},
		{"a read, attempt 3 timed out, 2 retries: none left", Meta{SideEffect: SideEffectRead, Retry: retry(2)}, 3, timeout, false, 0},
		{"a read, its worker lost before any attempt (a takeover runs at once)", Meta{SideEffect: SideEffectRead, Retry: retry(2)}, 0, lost, true, 10 * time.Millisecond},
		{"a read, no retry configured", Meta{SideEffect: SideEffectRead}, 1, timeout, false, 0},
		{"a read, an error not retryable", Meta{SideEffect: SideEffectRead, Retry: retry(2)}, 1, failed, false, 0},
		{"no side effect, its worker lost", Meta{SideEffect: SideEffectNone, Retry: retry(1)}, 1, lost, true, 10 * time.Millisecond},
		{"a write, not idempotent", Meta{SideEffect: SideEffectWrite, Retry: retry(5)}, 1, timeout, false, 0},
		{"a write, not idempotent, its worker lost", Meta{SideEffect: SideEffectWrite, Retry: retry(5)}, 1, lost, false, 0},
		{"a write, idempotent", Meta{SideEffect: SideEffectWrite, Idempotent: true, Retry: retry(5)}, 1, timeout, true, 10 * time.Millisecond},
		{"destructive, not idempotent", Meta{SideEffect: SideEffectDestructive, Retry: retry(5)}, 1, lost, false, 0},
		{"external, idempotent", Meta{SideEffect: SideEffectExternal, Idempotent: true, Retry: retry(5)}, 2, lost, true, 20 * time.Millisecond},
		{"RetryOn vetoes", Meta{SideEffect: SideEffectRead, Retry: &Retry{MaxAttempts: 2, RetryOn: func(error) bool { return false }}}, 1, timeout, false, 0},
		{"RetryOn allows", Meta{SideEffect: SideEffectRead, Retry: &Retry{MaxAttempts: 2, RetryOn: func(error) bool { return true }}}, 1, timeout, true, defaultBackoff},
		{"RetryOn panics: vetoed", Meta{SideEffect: SideEffectRead, Retry: &Retry{MaxAttempts: 2, RetryOn: func(error) bool { panic("no") }}}, 1, timeout, false, 0},
	} {
		w := &Worker{log: slog.New(slog.DiscardHandler)}
		c := newCapability(&binding{id: "t.cap", meta: tc.meta}, w)
		pause, ok := c.Retry(tc.n, tc.err)
		if ok != tc.ok || pause != tc.pause {
			t.Errorf("%s: Retry(%d, %s) = %v, %v; want %v, %v", tc.name, tc.n, tc.err.Code, pause, ok, tc.pause, tc.ok)
		}
	}
}
