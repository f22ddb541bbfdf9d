package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/capstan-dev/capstan/benchmarks/internal/heapsplit"
)

// heapSplits describes each heap profile the soak saved in dir.
func heapSplits(dir string) string {
	var b strings.Builder
	files := []struct{ file, when string }{
		{"server-heap-records-full.pb.gz", "record window full"},
		{"server-heap-envelopes-full.pb.gz", "envelope retention full"},
		{"server-heap.pb.gz", "end of the load"},
		{"server-heap-idle.pb.gz", "end of the idle time"},
	}
	var cols [][]int64
	var totals []int64
	var names []string
	var whens []string
	for _, f := range files {
		n, v, t, err := heapsplit.File(dir + string(os.PathSeparator) + f.file)
		if err != nil {
			continue
		}
		names, cols, totals, whens = n, append(cols, v), append(totals, t), append(whens, f.when)
	}
	if len(cols) == 0 {
		return ""
	}
	fmt.Fprintf(&b, "the server's live heap by part (heap profiles after a forced collection, MB):\n  %-32s", "")
	for _, w := range whens {
		fmt.Fprintf(&b, " %24s", w)
	}
	b.WriteString("\n")
	for n, name := range names {
		fmt.Fprintf(&b, "  %-32s", name)
		for _, c := range cols {
			fmt.Fprintf(&b, " %24.1f", mb(c[n]))
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "  %-32s", "live heap")
	for _, t := range totals {
		fmt.Fprintf(&b, " %24.1f", mb(t))
	}
	b.WriteString("\n")
	return b.String()
}
