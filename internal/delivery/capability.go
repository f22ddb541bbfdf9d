package delivery

import (
	"context"
	"log/slog"
	"time"

	"github.com/capstan-dev/capstan/envelope"
)

// Capability is what the machinery needs of the capability a request names.
// The public executor package provides it: the stages it runs (exposure,
// input, actor, policies, approval, output) and the retry rule belong to a
// capability's definition; claiming, leasing, attempts, takeovers and
// finalization belong here.
type Capability interface {
	// Admit runs stages 4 to 9 of a fresh execution. When a stage refuses it,
	// Admit finalizes the execution through x and returns nil.
	Admit(x *Execution) Admitted
	// Readmit restores what Admit established, for a takeover of an
	// execution whose attempts had started: the input, and the approval it
	// consumed. When it cannot, it finalizes the execution and returns nil.
	Readmit(x *Execution) Admitted
	// Timeout bounds one attempt.
	Timeout() time.Duration
	// Retries is how many attempts may follow the first.
	Retries() int
	// Backoff is the pause after failed attempt n before the next.
	Backoff(n int) time.Duration
	// RetryEligible is the SI-11 rule: whether a failed attempt may be
	// attempted again.
	RetryEligible(err *envelope.CapabilityError) bool
}

// Admitted is an execution its stages let through to its attempts.
type Admitted interface {
	// StartedData is the data of attempt n's capability.started event.
	StartedData(n int) map[string]any
	// Invoke calls the handler once, for attempt a.
	Invoke(ctx context.Context, a Attempt) (any, error)
	// CheckOutput is stages 12 and 13: validation, redaction, encoding of
	// what an attempt returned. Nothing of an output that fails them leaves
	// the worker.
	CheckOutput(out any) (envelope.Raw, *envelope.CapabilityError)
}

// Attempt is one call of a handler.
type Attempt struct {
	// N counts from 1; takeovers after a lost worker count too.
	N      int
	Logger *slog.Logger
}
