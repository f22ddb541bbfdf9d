package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/google/pprof/profile"
)

// heapPart is a part of the server's live heap, told by the stack that
// allocated it.
type heapPart struct {
	name string
	is   func(stack []string) bool
}

func anyFrame(stack []string, subs ...string) bool {
	for _, f := range stack {
		for _, s := range subs {
			if strings.Contains(f, s) {
				return true
			}
		}
	}
	return false
}

// heapParts are JetStream's file store structures that grow with what the
// streams hold, in the order a stack is tried against them.
var heapParts = []heapPart{
	// Subject trees under a message block are its per-block subject state;
	// the others are the stream's per-subject index.
	{"per-block subject state (fss)", func(st []string) bool {
		return anyFrame(st, "stree.") && anyFrame(st, "(*msgBlock).")
	}},
	{"per-subject index (psim)", func(st []string) bool { return anyFrame(st, "stree.") }},
	{"block caches", func(st []string) bool { return anyFrame(st, "getMsgBlockBuf", "server.init.func") }},
	{"duplicate window", func(st []string) bool { return anyFrame(st, "storeMsgIdLocked", "getMsgId", "purgeMsgIds") }},
	{"per-message TTL wheel", func(st []string) bool { return anyFrame(st, "thw.") }},
}

// heapSplit reads a heap profile and returns the live bytes (inuse_space)
// of each part, and of the rest, in heapParts' order.
func heapSplit(path string) (names []string, bytes []int64, total int64, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, 0, err
	}
	defer f.Close()
	p, err := profile.Parse(f)
	if err != nil {
		return nil, nil, 0, err
	}
	k := -1
	for n, st := range p.SampleType {
		if st.Type == "inuse_space" {
			k = n
		}
	}
	if k < 0 {
		return nil, nil, 0, fmt.Errorf("%s: no inuse_space", path)
	}
	bytes = make([]int64, len(heapParts)+1)
	for _, s := range p.Sample {
		var stack []string
		for _, loc := range s.Location {
			for _, l := range loc.Line {
				if l.Function != nil {
					stack = append(stack, l.Function.Name)
				}
			}
		}
		part := len(heapParts)
		for n, hp := range heapParts {
			if hp.is(stack) {
				part = n
				break
			}
		}
		bytes[part] += s.Value[k]
		total += s.Value[k]
	}
	for _, hp := range heapParts {
		names = append(names, hp.name)
	}
	return append(names, "everything else"), bytes, total, nil
}

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
		n, v, t, err := heapSplit(dir + string(os.PathSeparator) + f.file)
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
