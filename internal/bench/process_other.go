//go:build !(linux || darwin || windows)

package bench

import "time"

// ProcessCPU has no reading on this platform: 0.
func ProcessCPU() time.Duration { return 0 }

// PeakRSS has no reading on this platform: 0.
func PeakRSS() int64 { return 0 }
