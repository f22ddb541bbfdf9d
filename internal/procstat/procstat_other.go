//go:build !(linux || darwin || windows)

package procstat

import "time"

// CPU has no reading on this platform: 0.
func CPU() time.Duration { return 0 }

// PeakRSS has no reading on this platform: 0.
func PeakRSS() int64 { return 0 }
