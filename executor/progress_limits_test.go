package executor_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/capstan-dev/capstan/internal/testhooks"
)

// flood is a handler that reports as fast as it can, from four goroutines,
// until its context ends, then returns the context's error: the worst a
// handler can do with Call.Progress. reports counts what it reported, ended
// is closed once every goroutine stopped.
type flood struct {
	reports atomic.Int64
	calls   atomic.Int64
	ended   chan struct{}
}

// retries are runtime retries after the first attempt, of a read (a write
// is never retried).
func (f *flood) capability(id string, timeout time.Duration, retries int) executor.Capability {
	meta := executor.Meta{Description: "Reports its progress without pause.", Expose: executor.On(executor.SurfaceDirect),
		SideEffect: executor.SideEffectWrite, Timeout: timeout}
	if retries > 0 {
		meta.SideEffect = executor.SideEffectRead
		meta.Retry = &executor.Retry{MaxAttempts: retries, Backoff: 10 * time.Millisecond}
	}
	return executor.Define(id, meta, func(ctx context.Context, c executor.Call[map[string]any]) (map[string]any, error) {
		f.calls.Add(1)
		var wg sync.WaitGroup
		for g := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for n := 0; ctx.Err() == nil; n++ {
					c.Progress(float64(n), 0, "flooding from goroutine "+string(rune('a'+g)))
					f.reports.Add(1)
				}
			}()
		}
		wg.Wait()
		if c.Attempt == 1 {
			defer close(f.ended)
		}
		return nil, ctx.Err()
	})
}

// A handler that reports at any rate changes nothing of cancellation and
// timeouts (DESIGN §5 "Progress"): a cancel ends it CANCELLED at once, a
// per-attempt timeout ends it TIMEOUT and is retried only where retries are
// allowed, its context ends in both, and a write is never run twice — while
// the leases are renewed under the flood (a short lease: renewals fold the
// last report into the record).
func TestProgress_ReportingWithoutPause_CancellationAndTimeoutsUnchanged(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		timeout time.Duration
		retries int
		cancel  bool
		// want
		code     envelope.Code
		attempts int
	}{
		{name: "cancelled by its caller", timeout: time.Hour, cancel: true, code: envelope.CodeCancelled, attempts: 1},
		{name: "a write's timeout, never retried", timeout: 1500 * time.Millisecond, code: envelope.CodeTimeout, attempts: 1},
		{name: "a read's timeout, retried as its policy says", timeout: 700 * time.Millisecond, retries: 1, code: envelope.CodeTimeout, attempts: 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			env := testenv.Start(t)
			f := &flood{ended: make(chan struct{})}
			startWorker(t, env.Connect(t), executor.WorkerConfig{ID: "w", Lease: 900 * time.Millisecond},
				f.capability("test.flood", tc.timeout, tc.retries))
			c := newClient(t, env.Connect(t))
			ctx := ctxT(t)
			id := envelope.NewExecutionID()
			follow, err := c.Progress(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.Submit(ctx, "test.flood", nil, executor.WithID(id)); err != nil {
				t.Fatal(err)
			}
			// It floods: its reports reach the caller.
			select {
			case p := <-follow:
				if p.ExecutionID != id || p.Attempt != 1 {
					t.Fatalf("progress %+v", p)
				}
			case <-ctx.Done():
				t.Fatal("no progress reached the caller")
			}
			if tc.cancel {
				// A renewal under the flood wrote the last report.
				waitUntil(t, "the record's progress", func() bool {
					st, err := c.Status(ctx, id)
					return err == nil && st.Record != nil && st.Record.Progress != nil
				})
				if _, err := c.Cancel(ctx, id); err != nil {
					t.Fatal(err)
				}
			}
			e, err := c.Await(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if e.Status != envelope.StatusCancelled || e.Error == nil || e.Error.Code != tc.code || e.Attempts != tc.attempts {
				t.Fatalf("envelope %+v (error %+v), want cancelled %s after %d attempts", e, e.Error, tc.code, tc.attempts)
			}
			select {
			case <-f.ended:
			case <-ctx.Done():
				t.Fatal("the handler's context never ended")
			}
			if n := f.calls.Load(); n != int64(tc.attempts) {
				t.Fatalf("%d handler calls, want %d", n, tc.attempts)
			}
			t.Logf("%d reports", f.reports.Load())
			if f.reports.Load() < 100 {
				t.Fatalf("the handler reported only %d times: not a flood", f.reports.Load())
			}
			// The trail tells the same story: one start per attempt.
			starts := 0
			for _, ev := range trailOf(t, testhooks.Broker(c), id) {
				if ev.Type == audit.EventStarted {
					starts++
				}
			}
			if starts != tc.attempts {
				t.Fatalf("%d starts in the trail, want %d", starts, tc.attempts)
			}
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				t.Fatal("the test ran out of time")
			}
		})
	}
}
