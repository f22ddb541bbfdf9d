package bench

import (
	"syscall"
	"time"
)

// kernelSleep sleeps for d in the kernel: the runtime's timers would wake an
// idle process up to a millisecond late.
func kernelSleep(d time.Duration) {
	for end := time.Now().Add(d); d > 0; d = time.Until(end) {
		ts := syscall.NsecToTimespec(int64(d))
		if err := syscall.Nanosleep(&ts, nil); err != nil && err != syscall.EINTR {
			time.Sleep(d)
			return
		}
	}
}
