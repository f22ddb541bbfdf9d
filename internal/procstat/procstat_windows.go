package procstat

import (
	"syscall"
	"time"
)

// CPU is the CPU time, user and kernel, this process used so far.
func CPU() time.Duration {
	h, err := syscall.GetCurrentProcess()
	if err != nil {
		return 0
	}
	var creation, exit, kernel, user syscall.Filetime
	if err := syscall.GetProcessTimes(h, &creation, &exit, &kernel, &user); err != nil {
		return 0
	}
	return filetimeDuration(kernel) + filetimeDuration(user)
}

// filetimeDuration reads a FILETIME that holds a duration in 100 ns ticks
// (Filetime.Nanoseconds would subtract the 1601 epoch).
func filetimeDuration(ft syscall.Filetime) time.Duration {
	return time.Duration(uint64(ft.HighDateTime)<<32|uint64(ft.LowDateTime)) * 100
}

// PeakRSS is not read on Windows: 0.
func PeakRSS() int64 { return 0 }
