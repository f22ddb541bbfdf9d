// Package procstat reads this process's resource usage: the CPU time it has
// used (CPU) and its peak resident memory (PeakRSS). It is the one place
// capstan asks the operating system for them, for `capstan bench` and the
// executor's benchmarks; the calls sit behind build tags, and a platform that
// offers no reading reports 0.
//
//	cpu := procstat.CPU()
//	work()
//	fmt.Printf("%v of CPU, peak RSS %d MiB\n", procstat.CPU()-cpu, procstat.PeakRSS()>>20)
package procstat
