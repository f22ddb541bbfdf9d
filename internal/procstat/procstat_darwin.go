package procstat

// PeakRSS is this process's peak resident set in bytes (getrusage's
// ru_maxrss, which Darwin gives in bytes).
func PeakRSS() int64 {
	ru, ok := rusage()
	if !ok {
		return 0
	}
	return ru.Maxrss
}
