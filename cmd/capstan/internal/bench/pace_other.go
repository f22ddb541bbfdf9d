//go:build !linux

package bench

import "time"

// kernelSleep sleeps for d on the runtime's timers.
func kernelSleep(d time.Duration) {
	if d > 0 {
		time.Sleep(d)
	}
}
