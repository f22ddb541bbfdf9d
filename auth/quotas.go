package auth

import (
	"errors"
	"fmt"
)

// Quotas bound what one principal may keep capstan busy with, so that its
// traffic, mistakes or malice cost that principal alone (DESIGN §12
// "Quotas"). A producer's or approver's grant carries them to the workers,
// which refuse a request beyond one with QUOTA_EXCEEDED, naming the quota and
// its limit. -1 is no quota.
type Quotas struct {
	// QueuedRequests is how many of its requests may wait in the exec queue
	// at once, unstarted.
	QueuedRequests int64 `json:"queuedRequests"`
	// QueuedBytes is how many bytes its waiting requests may hold at once.
	QueuedBytes int64 `json:"queuedBytes"`
	// PendingApprovals is how many approvals it may have pending at once.
	PendingApprovals int64 `json:"pendingApprovals"`
	// ControlPerSecond is how many control requests (listings, describes,
	// cancels, probes) it may make per second.
	ControlPerSecond int64 `json:"controlPerSecond"`
}

// DefaultQuotas are a principal's quotas unless auth add or auth set says
// otherwise: far above what one agent host needs, far below what would let
// one principal hold the deployment up.
var DefaultQuotas = Quotas{QueuedRequests: 10_000, QueuedBytes: 64 << 20, PendingApprovals: 200, ControlPerSecond: 50}

// OrDefault returns q, or DefaultQuotas for a nil q.
func (q *Quotas) OrDefault() Quotas {
	if q == nil {
		return DefaultQuotas
	}
	return *q
}

// validate refuses a quota of 0 or below -1: each is positive, or -1 (none).
func (q Quotas) validate() error {
	return errors.Join(positiveOrNone("quota", []named{{"queuedRequests", q.QueuedRequests}, {"queuedBytes", q.QueuedBytes},
		{"pendingApprovals", q.PendingApprovals}, {"controlPerSecond", q.ControlPerSecond}})...)
}

// named is a limit's or a quota's name and value.
type named struct {
	name string
	v    int64
}

// positiveOrNone refuses each value of 0 or below -1: a limit or a quota
// (kind) is positive, or -1 for none.
func positiveOrNone(kind string, values []named) []error {
	var errs []error
	for _, f := range values {
		if f.v == 0 || f.v < -1 {
			errs = append(errs, fmt.Errorf("%s %s %d: want a positive number, or -1 for none", kind, f.name, f.v))
		}
	}
	return errs
}
