package main

import "time"

// cpuMeter measures the CPU time a system spends on the workload: this
// process's (client, workers, an embedded server) and, where the system
// runs a server of its own, that server's processes'.
type cpuMeter struct {
	pids  []int // the external server's main processes; their children count too
	start time.Duration
}

// meterCPU starts measuring this process and the processes pids (and their
// children).
func meterCPU(pids ...int) *cpuMeter {
	m := &cpuMeter{pids: pids}
	m.start = m.now()
	return m
}

func (m *cpuMeter) now() time.Duration {
	t := selfCPU()
	for _, p := range m.pids {
		if p > 0 {
			t += treeCPU(p)
		}
	}
	return t
}

// perTask is the CPU time spent since meterCPU, per task, in microseconds.
func (m *cpuMeter) perTask(n int) float64 {
	return float64((m.now() - m.start).Microseconds()) / float64(n)
}
