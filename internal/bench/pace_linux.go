package bench

import (
	"syscall"
	"time"
)

// sleepUntil returns at t, or at once when t has passed. An open loop's
// latency counts from when each call was due, so the load's own lateness
// counts against what it measures: the Go runtime's timers wake an idle
// process up to a millisecond late (its poller waits in whole milliseconds),
// a kernel sleep within tens of microseconds. The pacing goroutine holds
// an OS thread while it sleeps.
func sleepUntil(t time.Time) {
	for {
		d := time.Until(t)
		if d <= 0 {
			return
		}
		ts := syscall.NsecToTimespec(int64(d))
		if err := syscall.Nanosleep(&ts, nil); err != nil && err != syscall.EINTR {
			time.Sleep(d)
			return
		}
	}
}
