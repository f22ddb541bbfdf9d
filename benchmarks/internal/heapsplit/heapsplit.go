// Package heapsplit splits a Go heap profile of a JetStream server by the
// file store structures that allocated it: the per-subject index, the
// per-block subject state, block caches, the duplicate window, the TTL wheel
// and the rest. The soak and the retained-memory measurement read the
// server's profiles through it.
package heapsplit

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/google/pprof/profile"
)

// part is a part of the server's live heap, told by the stack that
// allocated it.
type part struct {
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
var parts = []part{
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

// File reads the heap profile at path and returns the live bytes
// (inuse_space) of each part, and of the rest, with the parts' names.
func File(path string) (names []string, bytes []int64, total int64, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, 0, err
	}
	defer f.Close()
	return Read(f)
}

// Read is File of a profile read from r.
func Read(r io.Reader) (names []string, bytes []int64, total int64, err error) {
	p, err := profile.Parse(r)
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
		return nil, nil, 0, fmt.Errorf("no inuse_space in the profile")
	}
	bytes = make([]int64, len(parts)+1)
	for _, s := range p.Sample {
		var stack []string
		for _, loc := range s.Location {
			for _, l := range loc.Line {
				if l.Function != nil {
					stack = append(stack, l.Function.Name)
				}
			}
		}
		which := len(parts)
		for n, hp := range parts {
			if hp.is(stack) {
				which = n
				break
			}
		}
		bytes[which] += s.Value[k]
		total += s.Value[k]
	}
	for _, hp := range parts {
		names = append(names, hp.name)
	}
	return append(names, "everything else"), bytes, total, nil
}
