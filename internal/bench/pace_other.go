//go:build !linux

package bench

import "time"

// sleep sleeps for d.
func sleep(d time.Duration) {
	if d > 0 {
		time.Sleep(d)
	}
}
