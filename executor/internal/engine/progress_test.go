package engine

import (
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/envelope"
)

// sent is one send of the coalescer: when, and the index of the report whose
// value it carries (the latest one made before it).
type sent struct {
	at     time.Duration
	report int
}

// coalesce runs the coalescer over reports made at the given offsets on an
// injected clock, firing each scheduled send at its time (before a report
// made at the same instant), and returns the sends.
func coalesce(every time.Duration, reports []time.Duration) []sent {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	c := coalescer{every: every}
	var out []sent
	due, scheduled := time.Duration(0), false
	latest := -1
	fire := func(at time.Duration) {
		c.fired(base.Add(at))
		out = append(out, sent{at, latest})
		scheduled = false
	}
	for i, at := range reports {
		if scheduled && due <= at {
			fire(due)
		}
		latest = i
		if delay, ok := c.offer(base.Add(at)); ok {
			due, scheduled = at+delay, true
		}
	}
	if scheduled {
		fire(due)
	}
	return out
}

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

func TestCoalescer_AtMostOneSendPerPeriodAndTheLastValueAlwaysSent(t *testing.T) {
	t.Parallel()
	every := ms(250)
	burst := make([]time.Duration, 1000) // a report every millisecond for a second
	for i := range burst {
		burst[i] = ms(i)
	}
	for _, c := range []struct {
		name    string
		reports []time.Duration
		want    []sent
	}{
		{"one report goes at once", []time.Duration{0}, []sent{{0, 0}}},
		{"a quick series: the first at once, the last one period later",
			[]time.Duration{0, ms(10), ms(20), ms(30)}, []sent{{0, 0}, {ms(250), 3}}},
		{"a report after a quiet period goes at once", []time.Duration{0, ms(300)}, []sent{{0, 0}, {ms(300), 1}}},
		{"one waiting, then a pause", []time.Duration{0, ms(100), ms(600)}, []sent{{0, 0}, {ms(250), 1}, {ms(600), 2}}},
		{"exactly one period apart", []time.Duration{0, ms(250), ms(500)}, []sent{{0, 0}, {ms(250), 1}, {ms(500), 2}}},
		{"a burst of 1,000 in a second: five sends", burst,
			[]sent{{0, 0}, {ms(250), 249}, {ms(500), 499}, {ms(750), 749}, {ms(1000), 999}}},
		{"nothing reported, nothing sent", nil, nil},
	} {
		if got := coalesce(every, c.reports); !slices.Equal(got, c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// Whatever the handler does, the rule holds: sends are at least a period
// apart, each carries the latest value reported before it, none is sent
// before it was reported, and the last report is sent.
func TestCoalescer_RuleHoldsForAnyReports(t *testing.T) {
	t.Parallel()
	every := ms(250)
	rng := rand.New(rand.NewPCG(1, 2))
	for run := range 500 {
		n := rng.IntN(200)
		reports := make([]time.Duration, n)
		at := time.Duration(0)
		for i := range reports {
			at += time.Duration(rng.Int64N(int64(ms(400)))) // 0 to 400 ms apart, equal times included
			reports[i] = at
		}
		got := coalesce(every, reports)
		if n == 0 {
			if len(got) != 0 {
				t.Fatalf("run %d: sends without reports: %v", run, got)
			}
			continue
		}
		if last := got[len(got)-1]; last.report != n-1 {
			t.Fatalf("run %d: the last send carries report %d of %d", run, last.report, n)
		}
		for i, s := range got {
			if reports[s.report] > s.at {
				t.Fatalf("run %d: send %d at %v carries a report made at %v", run, i, s.at, reports[s.report])
			}
			if s.report+1 < n && reports[s.report+1] < s.at {
				t.Fatalf("run %d: send %d at %v carries report %d, not the later %d", run, i, s.at, s.report, s.report+1)
			}
			if i > 0 && s.at-got[i-1].at < every {
				t.Fatalf("run %d: sends %d and %d %v apart", run, i-1, i, s.at-got[i-1].at)
			}
		}
		if max := reports[n-1]/every + 1; time.Duration(len(got)) > max+1 {
			t.Fatalf("run %d: %d sends over %v", run, len(got), reports[n-1])
		}
	}
}

// reporterOf is the reporter of an execution of id whose runner has no
// connection and the clock now.
func reporterOf(id string, now func() time.Time) *Reporter {
	x := &execution{w: &worker{now: now}, req: &envelope.Request{ExecutionID: id}}
	x.lease.progress.x = x
	return &x.lease.progress
}

// A reporter takes reports only from the attempt running: before, after,
// and from an attempt that ended (a handler still running after its timeout
// or its lost lease, while another attempt runs) they are dropped; a new
// attempt starts with nothing.
func TestReporter_TakesReportsOnlyFromTheAttemptRunning(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	r := reporterOf("x", func() time.Time { return now })
	r.Report(1, 1, 2, "before")
	if p := r.lastReport(); p != nil {
		t.Fatalf("before the attempt: %+v", p)
	}
	if r.s.Load() != nil {
		t.Fatal("a report before the attempt made the reporter's state")
	}
	r.begin(1)
	if r.s.Load() != nil {
		t.Fatal("an attempt that has not reported has the reporter's state")
	}
	r.Report(1, 1, 2, "a\nb")
	p := r.lastReport()
	if p == nil || p.Attempt != 1 || p.Done != 1 || p.Total != 2 || p.Message != "a b" || !p.At.Equal(now) || p.ExecutionID != "x" {
		t.Fatalf("during attempt 1: %+v", p)
	}
	r.end()
	r.Report(1, 2, 2, "late")
	if p := r.lastReport(); p.Message != "a b" {
		t.Fatalf("a late report was taken: %+v", p)
	}
	r.begin(2)
	if p := r.lastReport(); p != nil {
		t.Fatalf("attempt 2 starts with %+v", p)
	}
	r.Report(1, 2, 2, "attempt 1, still running")
	if p := r.lastReport(); p != nil {
		t.Fatalf("attempt 1's report was taken while attempt 2 runs: %+v", p)
	}
	r.Report(2, 1, 3, "attempt 2")
	if p := r.lastReport(); p == nil || p.Attempt != 2 || p.Message != "attempt 2" {
		t.Fatalf("during attempt 2: %+v", p)
	}
	var nilReporter *Reporter
	nilReporter.Report(1, 1, 1, "outside a worker") // no panic
}

// Reports racing the attempt's begin and end, from the attempt's handler
// and from an earlier attempt's: whatever the order, the reporter ends
// holding only reports of the attempt running (run with -race).
func TestReporter_RacingBeginAndEnd_OnlyTheAttemptRunningsReports(t *testing.T) {
	t.Parallel()
	for round := range 200 {
		r := reporterOf("x", time.Now)
		var wg sync.WaitGroup
		for _, attempt := range []int{1, 2} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 50 {
					r.Report(attempt, float64(i), 0, "")
				}
			}()
		}
		r.begin(1)
		r.end()
		r.begin(2)
		wg.Wait()
		if p := r.lastReport(); p != nil && p.Attempt != 2 {
			t.Fatalf("round %d: attempt 2 runs and the reporter holds %+v", round, p)
		}
		r.end()
	}
}

// What one report costs the handler that makes it (the publish, at most
// four a second, is a timer's): run with -bench Reporter -benchmem.
func BenchmarkReporter_Report(b *testing.B) {
	for _, tc := range []struct {
		name    string
		message string
	}{
		{"short message", "page 37 of 120"},
		{"message to clean", "page 37\tof 120\x1b[0m, " + strings.Repeat("é", 200)},
	} {
		b.Run(tc.name, func(b *testing.B) {
			r := reporterOf("x", time.Now)
			r.begin(1)
			defer r.end()
			b.ReportAllocs()
			for b.Loop() {
				r.Report(1, 37, 120, tc.message)
			}
		})
	}
	b.Run("four goroutines", func(b *testing.B) {
		r := reporterOf("x", time.Now)
		r.begin(1)
		defer r.end()
		b.ReportAllocs()
		b.SetParallelism(4)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				r.Report(1, 37, 120, "page 37 of 120")
			}
		})
	})
}
