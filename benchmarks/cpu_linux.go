//go:build linux

package main

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// selfCPU is this process's user and system CPU time.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// clockTick is the unit of /proc's CPU times (USER_HZ, 100 on Linux).
const clockTick = 10 * time.Millisecond

// treeCPU is the CPU time of process pid, of its children that ended (as
// the kernel counts them for pid once it has waited for them), and of its
// live children: a PostgreSQL server's backends are children of its
// postmaster.
func treeCPU(pid int) time.Duration {
	_, t, ok := procCPU(pid, true)
	if !ok {
		return 0
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return t
	}
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil || child == pid {
			continue
		}
		if parent, c, ok := procCPU(child, false); ok && parent == pid {
			t += c
		}
	}
	return t
}

// procCPU reads /proc/pid/stat: the parent's pid and the CPU time (with
// that of waited-for children when children is set).
func procCPU(pid int, children bool) (ppid int, t time.Duration, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, false
	}
	// The command name, in parentheses, may hold spaces: fields follow the
	// last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, 0, false
	}
	f := strings.Fields(s[i+1:])
	// f[0] is the state (field 3): ppid is field 4, utime 14, stime 15,
	// cutime 16, cstime 17.
	if len(f) < 15 {
		return 0, 0, false
	}
	ppid, _ = strconv.Atoi(f[1])
	sum := 0
	last := 12
	if children {
		last = 14
	}
	for _, v := range f[11 : last+1] {
		n, _ := strconv.Atoi(v)
		sum += n
	}
	return ppid, time.Duration(sum) * clockTick, true
}
