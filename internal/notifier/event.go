package notifier

import (
	"strings"
	"time"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/notify"
)

// Key is the idempotency key of an approval's event, "<approvalId>.<event>"
// ("a1.requested" for notify.EventRequested): every delivery of one
// notification carries the same key, whichever notifier sends it and however
// often.
func Key(approvalID string, e notify.Event) string {
	return approvalID + "." + strings.TrimPrefix(string(e), eventPrefix)
}

// eventPrefix begins every notify.Event; what follows it names the event in
// its key.
const eventPrefix = "approval."

// expiryMargin is how long after an approval's expiry its pending revision
// comes back to be notified as expired: past the expiry, whatever the
// server's timer precision.
const expiryMargin = time.Second

// plan is what one revision of an approval calls for.
type plan struct {
	// event to send; empty: nothing.
	event notify.Event
	// at is when the event happened.
	at time.Time
	// again, when not zero, is when the same revision must be looked at
	// once more: a pending approval's expiry.
	again time.Time
}

// due decides, from one stored revision of an approval alone, what to send
// at now (DESIGN §7, "Notifications"). since is when the channel's notify consumer was
// created: what was decided or expired before it is not notified, while an
// approval still pending is, however old its request.
//
//   - pending, before its expiry: requested, and look again at the expiry;
//   - pending, past its expiry (no one wrote it expired): expired;
//   - approved, rejected, cancelled: that decision;
//   - expired (written by a decision or a use that came too late): expired;
//   - consumed: nothing (its approval was notified when it was decided).
func due(r *approvals.Record, since, now time.Time) plan {
	switch r.Status {
	case approvals.StatusPending:
		if now.Before(r.ExpiresAt) {
			return plan{event: notify.EventRequested, at: r.RequestedAt, again: r.ExpiresAt.Add(expiryMargin)}
		}
		return after(since, notify.EventExpired, r.ExpiresAt)
	case approvals.StatusExpired:
		return after(since, notify.EventExpired, r.ExpiresAt)
	case approvals.StatusApproved, approvals.StatusRejected, approvals.StatusCancelled:
		if r.Decision == nil {
			return plan{}
		}
		return after(since, notify.Event(eventPrefix+string(r.Status)), r.Decision.DecidedAt)
	}
	return plan{}
}

func after(since time.Time, e notify.Event, at time.Time) plan {
	if at.Before(since) {
		return plan{}
	}
	return plan{event: e, at: at}
}

// backoff is the wait after the attempt-th failed attempt (1-based).
func (r Retry) backoff(attempt int) time.Duration {
	d := r.Initial
	for i := 1; i < attempt && d < r.Max; i++ {
		d *= 2
	}
	return min(d, r.Max)
}
