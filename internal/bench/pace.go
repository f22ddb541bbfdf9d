//go:build !linux

package bench

import "time"

// sleepUntil returns at t, or at once when t has passed.
func sleepUntil(t time.Time) {
	if d := time.Until(t); d > 0 {
		time.Sleep(d)
	}
}
