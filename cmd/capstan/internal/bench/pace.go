package bench

import "time"

// An open loop's latency counts from when each call was due, so the load's
// own lateness counts against what it measures. The Go runtime's timers
// wake an idle process up to a millisecond late (its poller waits in whole
// milliseconds); a kernel sleep wakes within the machine's own wake-up
// latency (about 0.2 ms on a virtual machine). When calls are far enough
// apart for the process to idle between them, a pacer sleeps in the kernel
// until shortly before each call is due and spins the rest. Closer calls
// keep the process busy, and its timers on time: a pacer then sleeps on
// them (a kernel sleep every few hundred microseconds would hand the
// pacing goroutine's processor back and forth).

// spinWindow is how long before a call is due a pacer stops sleeping.
const spinWindow = 300 * time.Microsecond

// pacer starts calls when they are due.
type pacer struct {
	spin bool
}

// newPacer returns the pacer of calls interval apart: it spins when that
// costs at most a tenth of a core.
func newPacer(interval time.Duration) pacer {
	return pacer{spin: interval >= 10*spinWindow}
}

// wait returns when due comes, or at once when it has passed.
func (p pacer) wait(due time.Time) {
	if !p.spin {
		if d := time.Until(due); d > 0 {
			time.Sleep(d)
		}
		return
	}
	kernelSleep(time.Until(due) - spinWindow)
	for time.Now().Before(due) {
	}
}
