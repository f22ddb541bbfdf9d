package mcpbridge

import (
	"fmt"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/executor"
)

// The values of a call's notifications always grow, as MCP asks; the
// handler's reports set them (done of total), the runtime's steps move them
// by a negligible step, and the final step fills the bar.
func TestProgressScale(t *testing.T) {
	t.Parallel()
	type op struct {
		step, final bool
		done, total float64
		dropped     bool // not sent
		wantValue   float64
		wantTotal   float64
	}
	s := stepValue
	for _, c := range []struct {
		name string
		ops  []op
	}{
		{"steps alone", []op{{step: true, wantValue: s}, {step: true, wantValue: 2 * s}, {step: true, final: true, wantValue: 3 * s}}},
		{"steps, then the handler's reports, then the end", []op{
			{step: true, wantValue: s},                            // queued
			{step: true, wantValue: 2 * s},                        // started
			{done: 0, total: 4, wantValue: 3 * s, wantTotal: 4},   // 0 of 4: barely moves
			{done: 1, total: 4, wantValue: 1, wantTotal: 4},       // 1 of 4
			{done: 3, total: 4, wantValue: 3, wantTotal: 4},       // 3 of 4
			{step: true, final: true, wantValue: 4, wantTotal: 4}, // completed: full
		}},
		{"a retry starts again: the bar never goes back", []op{
			{done: 37, total: 120, wantValue: 37, wantTotal: 120},
			{step: true, wantValue: 37 + s, wantTotal: 120},            // retrying
			{done: 2, total: 120, wantValue: 37 + 2*s, wantTotal: 120}, // attempt 2's first page
			{done: 40, total: 120, wantValue: 40, wantTotal: 120},
		}},
		{"no total: counts only", []op{{done: 5, wantValue: 5}, {done: 9, wantValue: 9}, {step: true, final: true, wantValue: 9 + s}}},
		{"done beyond the total: a step short of it", []op{{done: 5, total: 4, wantValue: 4 - s, wantTotal: 4}}},
		{"the handler reports its total before the end: the end fills the bar", []op{
			{step: true, wantValue: s},                            // started
			{done: 4, total: 4, wantValue: 4 - s, wantTotal: 4},   // 4 of 4: a step short
			{step: true, final: true, wantValue: 4, wantTotal: 4}, // completed: full, and grown
		}},
		{"no room left below the total: the total follows", []op{
			{done: 4, total: 4, wantValue: 4 - s, wantTotal: 4},
			{done: 4, total: 4, wantValue: 4, wantTotal: 4},
			{step: true, final: true, wantValue: 4 + s, wantTotal: 4 + s},
		}},
		{"a report after the end is not sent", []op{
			{done: 1, total: 4, wantValue: 1, wantTotal: 4},
			{step: true, final: true, wantValue: 4, wantTotal: 4},
			{done: 3, total: 4, dropped: true},
		}},
	} {
		var sc progressScale
		last := 0.0
		for i, o := range c.ops {
			var v, tot float64
			if o.step {
				v, tot = sc.step(o.final)
			} else {
				var ok bool
				v, tot, ok = sc.report(o.done, o.total, 1)
				if ok == o.dropped {
					t.Errorf("%s, op %d: sent %v, want %v", c.name, i, ok, !o.dropped)
				}
				if !ok {
					continue
				}
			}
			if v != o.wantValue || tot != o.wantTotal {
				t.Errorf("%s, op %d: %v of %v, want %v of %v", c.name, i, v, tot, o.wantValue, o.wantTotal)
			}
			if v <= last {
				t.Errorf("%s, op %d: %v after %v", c.name, i, v, last)
			}
			if tot > 0 && v > tot {
				t.Errorf("%s, op %d: %v beyond its total %v", c.name, i, v, tot)
			}
			last = v
		}
	}
}

// The trail's steps and the handler's reports travel apart: a step that
// precedes work the handler already reported from (queued; started, attempt
// n) is not sent after it, and a later attempt's start still is.
func TestProgressScale_StepsBeforeReportedWorkAreStale(t *testing.T) {
	t.Parallel()
	var sc progressScale
	if sc.stale(1) || sc.stale(0) {
		t.Fatal("a step is stale before any report")
	}
	if _, _, ok := sc.report(0, 10, 0); !ok {
		t.Fatal("the first report was not sent")
	}
	for _, c := range []struct {
		precedes int
		want     bool
	}{{1, true}, {0, false}, {2, false}} {
		if got := sc.stale(c.precedes); got != c.want {
			t.Errorf("after attempt 1's report, a step before attempt %d: stale %v, want %v", c.precedes, got, c.want)
		}
	}
	if _, _, ok := sc.report(0, 10, 2); !ok {
		t.Fatal("the retry's report was not sent")
	}
	if !sc.stale(2) || sc.stale(3) {
		t.Errorf("after attempt 2's report: stale(2) %v, stale(3) %v; want true, false", sc.stale(2), sc.stale(3))
	}
}

// The bridge keeps the last report of at most maxLive executions, even when
// every report carries the same time (forged ones on an open server may).
func TestLiveProgress_BoundedWhateverTheReportsTimes(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name string
		at   func(i int) time.Time
	}{
		{"one time for all", func(int) time.Time { return at }},
		{"each its own", func(i int) time.Time { return at.Add(time.Duration(i) * time.Millisecond) }},
	} {
		l := liveProgress{last: map[string]executor.Progress{}}
		for i := range 3 * maxLive {
			l.put(executor.Progress{V: 1, ExecutionID: fmt.Sprintf("x%d", i), At: c.at(i)})
			if len(l.last) > maxLive {
				t.Fatalf("%s: %d kept after %d reports", c.name, len(l.last), i+1)
			}
		}
		if p := l.of(fmt.Sprintf("x%d", 3*maxLive-1), 0, nil); p == nil {
			t.Fatalf("%s: the newest report is gone", c.name)
		}
	}
}
