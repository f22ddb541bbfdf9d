//go:build linux || darwin

package executor_test

import (
	"syscall"
	"time"
)

// processCPU is the CPU time this process (server, worker and client of a
// benchmark) has used, user and system; it is not inflated when other
// processes share the machine, as wall time is.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
