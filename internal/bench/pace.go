package bench

import "time"

// An open loop's latency counts from when each call was due, so the load's
// own lateness counts against what it measures. The Go runtime's timers
// wake an idle process up to a millisecond late (its poller waits in whole
// milliseconds); a kernel sleep wakes within the machine's own wake-up
// latency (about 0.2 ms on a virtual machine). A pacer sleeps until shortly
// before each call is due and spins the rest, when calls are far enough
// apart for the spinning to cost little.

// spinWindow is how long before a call is due a pacer stops sleeping.
const spinWindow = 300 * time.Microsecond

// pacer starts calls when they are due.
type pacer struct {
	spin time.Duration // 0: sleep the whole wait
}

// newPacer returns the pacer of calls interval apart: it spins when that
// costs at most a tenth of a core.
func newPacer(interval time.Duration) pacer {
	if interval >= 10*spinWindow {
		return pacer{spin: spinWindow}
	}
	return pacer{}
}

// wait returns when due comes, or at once when it has passed.
func (p pacer) wait(due time.Time) {
	sleep(time.Until(due) - p.spin)
	for p.spin > 0 && time.Now().Before(due) {
	}
}
