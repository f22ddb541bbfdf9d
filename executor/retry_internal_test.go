package executor

import (
	"testing"
	"time"

	"github.com/capstan-dev/capstan/envelope"
)

func TestBackoff_DoublesFromTheConfiguredOrDefaultBase(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		retry *Retry
		want  []time.Duration
	}{
		{nil, []time.Duration{250 * time.Millisecond, 500 * time.Millisecond, time.Second}},
		{&Retry{MaxAttempts: 3}, []time.Duration{250 * time.Millisecond, 500 * time.Millisecond, time.Second}},
		{&Retry{MaxAttempts: 3, Backoff: 10 * time.Millisecond}, []time.Duration{10 * time.Millisecond, 20 * time.Millisecond, 40 * time.Millisecond}},
	} {
		m := Meta{Retry: tc.retry}
		for i, want := range tc.want {
			if got := m.backoff(i + 1); got != want {
				t.Errorf("retry %+v: backoff after attempt %d is %v, want %v", tc.retry, i+1, got, want)
			}
		}
	}
}

// TestSI11_RuntimeRuleHoldsWithoutTheRegistry: the pipeline's own check
// refuses a retry of non-idempotent write-like work even if metadata that the
// registry would refuse reached it.
func TestSI11_RuntimeRuleHoldsWithoutTheRegistry(t *testing.T) {
	t.Parallel()
	retryable := &envelope.CapabilityError{Code: envelope.CodeTimeout, Retryable: true}
	for _, se := range []SideEffect{SideEffectWrite, SideEffectDestructive, SideEffectExternal} {
		for _, idem := range []bool{false, true} {
			c := &capability{b: &binding{meta: Meta{SideEffect: se, Idempotent: idem, Retry: &Retry{MaxAttempts: 5}}}}
			if got := c.RetryEligible(retryable); got != idem {
				t.Errorf("%s, idempotent %t: retry eligible %t", se, idem, got)
			}
		}
	}
}
