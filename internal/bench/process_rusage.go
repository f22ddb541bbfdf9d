//go:build linux || darwin

package bench

import (
	"syscall"
	"time"
)

// ProcessCPU is the CPU time, user and system, this process used so far.
func ProcessCPU() time.Duration {
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
