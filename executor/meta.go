package executor

import (
	"fmt"
	"time"
)

// SideEffect says what a capability does to the world. It decides whether the
// runtime may ever retry it (SI-11).
type SideEffect string

// Side effects.
const (
	SideEffectNone        SideEffect = "none"
	SideEffectRead        SideEffect = "read"
	SideEffectWrite       SideEffect = "write"
	SideEffectDestructive SideEffect = "destructive"
	SideEffectExternal    SideEffect = "external"
)

// writeLike reports whether repeating the call may repeat an effect.
func (s SideEffect) writeLike() bool {
	return s == SideEffectWrite || s == SideEffectDestructive || s == SideEffectExternal
}

// Risk grades a capability for reviewers and policies.
type Risk string

// Risks.
const (
	RiskLow      Risk = "low"
	RiskMedium   Risk = "medium"
	RiskHigh     Risk = "high"
	RiskCritical Risk = "critical"
)

// Surface is where a call comes from; a client or adapter fixes it, never the
// request's payload.
type Surface string

// Surfaces.
const (
	SurfaceDirect Surface = "direct"
	SurfaceMCP    Surface = "mcp"
	SurfaceHTTP   Surface = "http"
)

// Exposure lists the surfaces a capability is exposed on. Deny by default: a
// capability with no exposure is reachable from nowhere.
type Exposure []Surface

// On builds an exposure.
func On(surfaces ...Surface) Exposure { return Exposure(surfaces) }

// Has reports whether s is exposed.
func (e Exposure) Has(s Surface) bool {
	for _, x := range e {
		if x == s {
			return true
		}
	}
	return false
}

// Retry configures runtime retries of stage 11. The zero value (and a nil
// *Retry) means no retry.
type Retry struct {
	// MaxAttempts is the number of additional attempts after the first.
	MaxAttempts int
	// Backoff before attempt n+1 is Backoff * 2^(n-1). Default 250 ms.
	Backoff time.Duration
	// RetryOn, when set, may veto a retry of a retryable error. err is the
	// attempt's *envelope.CapabilityError (TIMEOUT, or the handler's error
	// classified); it wraps what the handler returned, so errors.Is and
	// errors.As reach the handler's own errors. A RetryOn that panics vetoes.
	RetryOn func(err error) bool
}

// ApprovalRule requires a human decision before the handler runs.
type ApprovalRule struct {
	// Required asks for approval on every call.
	Required bool
	// Reason is shown to the approver.
	Reason string
	// TTL is how long the approval stays decidable. Default 15 min.
	TTL time.Duration
}

// Meta is a capability's metadata. Zero values are the safe defaults: exposed
// nowhere, no side effect declared (refused), no retry, 30 s timeout.
type Meta struct {
	// Description tells a model and a reviewer what the capability does; it
	// is required.
	Description string
	// Expose lists the surfaces that may see and call it (On(...)); none by
	// default.
	Expose Exposure
	// SideEffect is what a call does to the world; required. It decides
	// which retries the registry allows (SI-11).
	SideEffect SideEffect
	// Risk grades it for reviewers and policies.
	Risk Risk
	// Tags are free labels, for discovery filters and policies.
	Tags []string
	// Timeout arms per attempt. Default 30 s.
	Timeout time.Duration
	// Retry is the runtime retry rule; nil: never retried.
	Retry *Retry
	// Idempotent is a reviewable claim that repeating the call with identical
	// input is safe because the handler deduplicates with Call.IdempotencyKey.
	// A read (side effect none or read) declared Idempotent, with no
	// approval, limit or recovery, runs without a claim: faster, and a run
	// lost with its worker runs again (docs/guarantees.md, "Reads without
	// claims").
	Idempotent bool
	// Approval, when Required, makes every call wait for someone else's
	// approval before it runs.
	Approval *ApprovalRule
	// Policies evaluated for this capability after the runtime's own.
	Policies []Policy
	// Limits bound how many run at once, how fast and how much, across
	// every worker (DESIGN §17). None: no limit, and no round trip.
	Limits []Limit
	// RedactOutput, when set, returns what of the output may leave the
	// worker (stage 13). It receives the validated output value; the envelope
	// carries only what it returns. If it panics, the output is withheld.
	RedactOutput func(out any) any
	// RedactApprovalInput, when set, returns what an approver is shown of the
	// input. It receives the validated input (a pointer to the input type).
	// The approval still binds the whole validated input by its hash (SI-4).
	RedactApprovalInput func(in any) any
}

// unclaimed reports whether calls of a capability with this metadata run
// without a claim (see Idempotent): a read (side effect none or read) declared Idempotent,
// which asks for no approval and takes no limit, and declares no recovery.
// No execution record is written for such a call, only its envelope, so:
// a run lost with its worker runs again on the next delivery rather than
// ending OUTCOME_UNKNOWN; two deliveries may run at once, the first
// envelope written standing; `capstan status` says queued until the
// envelope is written; a receipt is refused; and a cancel recorded while the
// call waits in its queue stops it only when the worker that takes it heard
// of the cancel (it was running then). The timeout, the caller's cancel of
// a running call, the trail and one envelope per execution hold as for any
// call (docs/guarantees.md, "Reads without claims").
func (m Meta) unclaimed() bool {
	read := m.SideEffect == SideEffectNone || m.SideEffect == SideEffectRead
	return read && m.Idempotent && (m.Approval == nil || !m.Approval.Required) && len(m.Limits) == 0
}

// redact applies a redaction function, if any, failing closed on a panic.
func redact(f func(any) any, v any) (out any, err error) {
	if f == nil {
		return v, nil
	}
	defer func() {
		if r := recover(); r != nil {
			out, err = nil, fmt.Errorf("redaction panicked: %v", r)
		}
	}()
	return f(v), nil
}

// approvalDisplay is what an approver is shown of a validated input: the
// input itself, or what Meta.RedactApprovalInput keeps of it.
func (m Meta) approvalDisplay(in any) (any, error) { return redact(m.RedactApprovalInput, in) }

// defaultTimeout is a capability's per-attempt timeout unless it says otherwise.
const defaultTimeout = 30 * time.Second

// defaultBackoff is the first retry's delay unless Retry says otherwise.
const defaultBackoff = 250 * time.Millisecond

func (m Meta) timeout() time.Duration {
	if m.Timeout > 0 {
		return m.Timeout
	}
	return defaultTimeout
}

func (m Meta) maxAttempts() int {
	if m.Retry == nil || m.Retry.MaxAttempts < 0 {
		return 0
	}
	return m.Retry.MaxAttempts
}

func (m Meta) backoff(attempt int) time.Duration {
	base := defaultBackoff
	if m.Retry != nil && m.Retry.Backoff > 0 {
		base = m.Retry.Backoff
	}
	if attempt < 1 {
		attempt = 1
	}
	if attempt > 20 {
		attempt = 20
	}
	return base << (attempt - 1)
}
