package envelope

import (
	"errors"
	"fmt"
	"time"
)

// ErrQuotaExceeded is what every refusal by a quota matches with errors.Is:
// the request was beyond one of its principal's quotas (DESIGN §12
// "Quotas"), and nothing of it ran. Every *CapabilityError of code
// QUOTA_EXCEEDED matches it; errors.As finds it with its details.
var ErrQuotaExceeded = errors.New("capstan: over a quota of the principal")

// Names of the quotas in QUOTA_EXCEEDED's details (auth.Quotas' fields).
const (
	QuotaQueuedRequests   = "queuedRequests"
	QuotaQueuedBytes      = "queuedBytes"
	QuotaPendingApprovals = "pendingApprovals"
	QuotaControlPerSecond = "controlPerSecond"
)

// QuotaExceeded is the refusal of a request beyond its principal's quota:
// QUOTA_EXCEEDED, exposed to the model with its details {"quota", "limit",
// "retryAfterMs"} (retryAfterMs only when retryAfter is positive, and the
// error is then retryable), at stage (may be empty for a request outside
// the pipeline). what says in a few words what the quota bounds.
func QuotaExceeded(stage, quota, what string, limit int64, retryAfter time.Duration) *CapabilityError {
	details := map[string]any{"quota": quota, "limit": limit}
	msg := fmt.Sprintf("Over the %s quota: at most %d %s.", quota, limit, what)
	if retryAfter > 0 {
		ms := max(retryAfter.Milliseconds(), 1)
		details["retryAfterMs"] = ms
		msg += fmt.Sprintf(" Try again in %s.", time.Duration(ms)*time.Millisecond)
	}
	return &CapabilityError{Code: CodeQuotaExceeded, Stage: stage, Message: msg, Retryable: retryAfter > 0,
		ExposeToModel: true, Details: details}
}

// QuotaRefusal turns a quota's refusal a reply carried (its message and
// details) back into the error QuotaExceeded made: a *CapabilityError that
// matches ErrQuotaExceeded.
func QuotaRefusal(message string, details map[string]any) *CapabilityError {
	_, wait := details["retryAfterMs"]
	return &CapabilityError{Code: CodeQuotaExceeded, Message: message, Retryable: wait, ExposeToModel: true, Details: details}
}

// QueueUsage is what one principal's queue holds and may hold.
type QueueUsage struct {
	// Principal is whose queue it is.
	Principal string `json:"principal"`
	// Stream is the queue's stream (the shared exec stream for a principal
	// without a queue of its own).
	Stream string `json:"stream"`
	// Requests is how many requests it holds: not yet ended.
	Requests uint64 `json:"requests"`
	// Bytes is how many bytes they hold.
	Bytes uint64 `json:"bytes"`
	// MaxRequests is how many requests it may hold; -1: no bound.
	MaxRequests int64 `json:"maxRequests"`
	// MaxBytes is how many bytes it may hold; -1: no bound.
	MaxBytes int64 `json:"maxBytes"`
}
