package console

import (
	"context"
	"errors"
	"time"

	"github.com/capstan-dev/capstan/internal/auditproof"
	"github.com/capstan-dev/capstan/internal/trail"
)

// logCheck is what the execution page says of its trail and the audit log
// (DESIGN §8, "The trail as a log"): whether the trail, and the envelope
// its terminal event commits to, verify against the latest signed
// checkpoint.
type logCheck struct {
	// State is verified, pending (not in a checkpoint yet), failed, or
	// none (the deployment has no checkpointer).
	State string
	// Size and Time are the checkpoint's; Origin the log's name.
	Size   int64
	Time   time.Time
	Origin string
	// Stated: checked with the key the deployment states, not one the
	// console was given.
	Stated bool
	// Envelope: the envelope is the one the trail commits to.
	Envelope bool
	Detail   string
}

// proofWait is how long a page waits for a checkpoint that covers a trail
// that just ended (the checkpointer signs about every second).
const proofWait = 1500 * time.Millisecond

// checkTrail proves d's trail in the latest checkpoint and verifies it, for
// a session that reads the streams (an admin's, an open server's); nil for
// others, and while the execution runs.
func (c *Console) checkTrail(ctx context.Context, s *session, d *execData) *logCheck {
	b := s.broker()
	if b == nil || !d.Ended || d.Summary == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, proofWait)
	defer cancel()
	lc := &logCheck{}
	keys := c.cfg.AuditKeys
	if keys == "" {
		var err error
		if keys, err = trail.StatedKeys(ctx, b); err != nil {
			lc.State = "none"
			return lc
		}
		lc.Stated = true
	}
	p, err := auditproof.Prove(ctx, b, d.Summary.Principal, d.ID, keys)
	switch {
	case errors.Is(err, trail.ErrNoLog):
		lc.State = "none"
		return lc
	case errors.Is(err, trail.ErrNotCovered):
		lc.State = "pending"
		return lc
	case err != nil:
		lc.State, lc.Detail = "failed", err.Error()
		return lc
	}
	if cp, err := trail.OpenUnverified([]byte(p.Checkpoint)); err == nil {
		lc.Size, lc.Time, lc.Origin = cp.Size, cp.Time, cp.Origin
	}
	if err := p.Verify(keys); err != nil {
		lc.State, lc.Detail = "failed", err.Error()
		return lc
	}
	lc.State, lc.Envelope = "verified", p.Envelope != nil
	return lc
}
