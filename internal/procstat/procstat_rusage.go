//go:build linux || darwin

package procstat

import (
	"syscall"
	"time"
)

// CPU is the CPU time, user and system, this process used so far.
func CPU() time.Duration {
	ru, ok := rusage()
	if !ok {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func rusage() (syscall.Rusage, bool) {
	var ru syscall.Rusage
	err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru, err == nil
}
