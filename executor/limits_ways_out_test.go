package executor_test

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
)

type waysIn struct {
	Way string `json:"way,omitempty"` // "", "panic", "timeout", "hold"
}

// waysCapability may run once at a time; each way out of its handler is
// one input: a panic, a per-attempt timeout, a hold until cancelled.
func waysCapability(run *running, timeout time.Duration) executor.Capability {
	return executor.Define("t.ways", executor.Meta{Description: "Leaves its handler every way.",
		Expose: executor.On(executor.SurfaceDirect), SideEffect: executor.SideEffectWrite, Timeout: timeout,
		Limits: []executor.Limit{{Kind: executor.LimitConcurrency, Max: 1}}},
		func(ctx context.Context, call executor.Call[waysIn]) (string, error) {
			run.enter()
			defer run.leave()
			switch call.Input.Way {
			case "panic":
				panic("the handler panics")
			case "timeout", "hold":
				<-ctx.Done()
				return "", ctx.Err()
			}
			return "ran", nil
		})
}

// slotHeld is a worker serving t.ways whose only slot a call holds until
// it is cancelled.
type slotHeld struct {
	env  *testenv.Env
	run  *running
	w    *executor.Worker
	c    *executor.Client
	held string // the call holding the slot
}

// holdTheSlot starts a worker of t.ways and a call that holds its slot.
func holdTheSlot(t *testing.T) slotHeld {
	t.Helper()
	s := slotHeld{env: testenv.Start(t), run: &running{}}
	s.w = startWorker(t, s.env.Connect(t), executor.WorkerConfig{}, waysCapability(s.run, time.Hour))
	s.c = newClient(t, s.env.Connect(t))
	held, err := s.c.Submit(ctxT(t), "t.ways", waysIn{Way: "hold"})
	if err != nil {
		t.Fatal(err)
	}
	s.held = held
	waitUntil(t, "the held call runs", func() bool { return s.run.now.Load() == 1 })
	return s
}

// waysHolders reads how many executions hold t.ways's slot.
func waysHolders(t *testing.T, js jetstream.JetStream) int {
	t.Helper()
	kv, err := js.KeyValue(ctxT(t), "CAPSTAN_LIMITS")
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(ctxT(t), "c.t.ways")
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		Holders []struct{} `json:"holders"`
	}
	if err := envelope.Unmarshal(e.Value(), &c); err != nil {
		t.Fatal(err)
	}
	return len(c.Holders)
}

// The only slot comes back on every way out of a handler: a panic, the
// per-attempt timeout, the caller's cancel while it runs. After each, the
// bucket holds no holder and the next call runs.
func TestLimits_TheSlotComesBackOnEveryWayOut(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	js := env.JetStream(t)
	run := &running{}
	startWorker(t, env.Connect(t), executor.WorkerConfig{}, waysCapability(run, 300*time.Millisecond))
	c := newClient(t, env.Connect(t))
	ctx := ctxT(t)
	next := func(after string) {
		t.Helper()
		waitUntil(t, "the slot given back after "+after, func() bool { return waysHolders(t, js) == 0 })
		if env, err := c.Call(ctx, "t.ways", waysIn{}, executor.StartWithin(30*time.Second)); err != nil || env.Status != envelope.StatusCompleted {
			t.Fatalf("the call after %s: %v %+v", after, err, env)
		}
	}
	if env, err := c.Call(ctx, "t.ways", waysIn{Way: "panic"}); err != nil || env.Error == nil || env.Error.Code != envelope.CodeExecutionFailed {
		t.Fatalf("the panicking call: %v %+v", err, env)
	}
	next("a panic")
	if env, err := c.Call(ctx, "t.ways", waysIn{Way: "timeout"}); err != nil || env.Error == nil || env.Error.Code != envelope.CodeTimeout {
		t.Fatalf("the call past its timeout: %v %+v", err, env)
	}
	next("a timeout")
	held, err := c.Submit(ctx, "t.ways", waysIn{Way: "hold"})
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the held call runs", func() bool { return run.now.Load() == 1 })
	if _, err := c.Cancel(ctx, held); err != nil {
		t.Fatal(err)
	}
	if env, err := c.Await(ctx, held); err != nil || env.Error == nil || env.Error.Code != envelope.CodeCancelled {
		t.Fatalf("the cancelled call: %v %+v", err, env)
	}
	next("a cancel")
	if most := run.most.Load(); most > 1 {
		t.Errorf("%d handlers ran at once, limit 1", most)
	}
}

// A call waiting for the slot is ended by its caller's cancel (CANCELLED)
// or by its start deadline (NOT_STARTED): never run, its trail saying it
// waited; the holder is untouched.
func TestLimits_ACancelOrTheStartDeadlineEndsAWaitingCall(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		cancel bool
		later  bool // cancelled once it came back to wait three times
		want   envelope.Code
	}{
		{"cancelled", true, false, envelope.CodeCancelled},
		{"cancelled after coming back", true, true, envelope.CodeCancelled},
		{"start deadline", false, false, envelope.CodeNotStarted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := holdTheSlot(t)
			env, run, c, held := s.env, s.run, s.c, s.held
			js := env.JetStream(t)
			ctx := ctxT(t)
			within := time.Hour
			if !tc.cancel {
				within = 3 * time.Second
			}
			waiting, err := c.Submit(ctx, "t.ways", waysIn{}, executor.StartWithin(within))
			if err != nil {
				t.Fatal(err)
			}
			limited := errors.New("limited")
			if err := c.FollowTrail(ctx, waiting, func(ev audit.Event) error {
				if ev.Type == audit.EventLimited {
					return limited
				}
				return nil
			}, audit.FromStart()); !errors.Is(err, limited) {
				t.Fatalf("following the waiting call: %v", err)
			}
			if tc.later {
				waitUntil(t, "the waiting call back three times", func() bool { return s.w.Stats().Limited >= 4 })
			}
			if tc.cancel {
				if _, err := c.Cancel(ctx, waiting); err != nil {
					t.Fatal(err)
				}
			}
			got, err := c.Await(ctx, waiting)
			if err != nil || got.Error == nil || got.Error.Code != tc.want {
				t.Fatalf("the waiting call: %v %+v, want %s", err, got, tc.want)
			}
			// Its request once, the limit it waited at once, its end once.
			end := audit.EventFailed
			if tc.cancel {
				end = audit.EventCancelled
			}
			if types := typesOf(trail(t, c, waiting)); !slices.Equal(types, []string{audit.EventRequested, audit.EventLimited, end}) {
				t.Errorf("the waiting call's trail %v: want requested, limited, %s", types, end)
			}
			if n := run.calls.Load(); n != 1 {
				t.Errorf("%d handler calls, want the held one alone", n)
			}
			if n := waysHolders(t, js); n != 1 {
				t.Errorf("%d holders, want the held call's", n)
			}
			if _, err := c.Cancel(ctx, held); err != nil {
				t.Fatal(err)
			}
			waitUntil(t, "the held call's slot given back", func() bool { return waysHolders(t, js) == 0 })
		})
	}
}

// A handler that ignores its context past its timeout still runs: the
// slot it holds is given neither to another call nor to a retry of its own
// execution until it returns.
func TestLimits_AnAbandonedHandlerKeepsItsSlot(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		calls int
		retry *executor.Retry
	}{
		{"three calls", 3, nil},
		{"one call retried", 1, &executor.Retry{MaxAttempts: 3, Backoff: time.Millisecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			env := testenv.Start(t)
			run := &running{}
			deaf := executor.Define("t.deaf", executor.Meta{Description: "Ignores its context.",
				Expose: executor.On(executor.SurfaceDirect), SideEffect: executor.SideEffectRead, Timeout: 100 * time.Millisecond,
				Retry: tc.retry, Limits: []executor.Limit{{Kind: executor.LimitConcurrency, Max: 1}}},
				func(ctx context.Context, call executor.Call[struct{}]) (string, error) {
					run.enter()
					defer run.leave()
					time.Sleep(500 * time.Millisecond)
					return "late", nil
				})
			startWorker(t, env.Connect(t), executor.WorkerConfig{}, deaf)
			c := newClient(t, env.Connect(t))
			ctx := ctxT(t)
			var ids []string
			for range tc.calls {
				id, err := c.Submit(ctx, "t.deaf", struct{}{})
				if err != nil {
					t.Fatal(err)
				}
				ids = append(ids, id)
			}
			for _, id := range ids {
				if env, err := c.Await(ctx, id); err != nil || env.Error == nil || env.Error.Code != envelope.CodeTimeout {
					t.Fatalf("%s: %v %+v", id, err, env)
				}
			}
			waitUntil(t, "every handler returned", func() bool { return run.now.Load() == 0 })
			if most := run.most.Load(); most > 1 {
				t.Errorf("%d handlers ran at once, limit 1", most)
			}
			want := int64(tc.calls)
			if tc.retry != nil {
				want *= int64(1 + tc.retry.MaxAttempts)
			}
			if n := run.calls.Load(); n != want {
				t.Errorf("%d handler calls, want %d", n, want)
			}
		})
	}
}

// A worker whose connection is cut while its handler holds the only slot
// (a handler that lasts until its context ends): the slot comes back
// within the lease, to a call another worker runs, and the cut handler has
// stopped by then: no moment sees two.
func TestLimits_ACutWorkersSlotComesBackWithinItsLease(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	js := env.JetStream(t)
	run := &running{}
	cut := env.Connect(t)
	startWorker(t, cut, executor.WorkerConfig{Lease: 2 * time.Second}, waysCapability(run, time.Hour))
	c := newClient(t, env.Connect(t))
	ctx := ctxT(t)
	held, err := c.Submit(ctx, "t.ways", waysIn{Way: "hold"})
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the held call runs", func() bool { return run.now.Load() == 1 })
	cut.Close()
	startWorker(t, env.Connect(t), executor.WorkerConfig{Lease: 2 * time.Second}, waysCapability(run, time.Hour))
	if env, err := c.Call(ctx, "t.ways", waysIn{}, executor.StartWithin(time.Minute)); err != nil || env.Status != envelope.StatusCompleted {
		t.Fatalf("a call after the cut: %v %+v", err, env)
	}
	if got, err := c.Await(ctx, held); err != nil || got.Status != envelope.StatusFailed {
		t.Fatalf("the cut call: %v %+v", err, got)
	}
	if most := run.most.Load(); most > 1 {
		t.Errorf("%d handlers ran at once, limit 1", most)
	}
	waitUntil(t, "every slot given back", func() bool { return waysHolders(t, js) == 0 })
}

// A write waiting at a rate longer than the record window runs once the rate
// allows: it comes back within a third of the window, each return keeping
// its record. Its record lapsed while it waited, it ended OUTCOME_UNKNOWN
// never having run (nothing left proved that no attempt had).
func TestLimits_AWaitLongerThanTheRecordWindowStillRuns(t *testing.T) {
	t.Parallel()
	cfg := broker.Config{RecordWindow: 2 * time.Second}
	env := testenv.Start(t)
	s := newStoreWith(t, env, cfg, executor.ClientConfig{})
	var calls atomic.Int64
	w := startWorker(t, env.Connect(t), executor.WorkerConfig{Deployment: executor.Deployment(cfg)},
		executor.Define("t.rated", executor.Meta{Description: "One every 8 s.", Expose: executor.On(executor.SurfaceDirect),
			SideEffect: executor.SideEffectWrite, Limits: []executor.Limit{{Kind: executor.LimitRate, Max: 1, Interval: 8 * time.Second}}},
			func(context.Context, executor.Call[struct{}]) (bool, error) { calls.Add(1); return true, nil }))
	ctx := ctxT(t)
	for _, chosen := range []string{"", "invoice-10", ""} {
		id := chosen
		if id == "" {
			id = envelope.NewExecutionID() // made as it is sent: an older one is taken for a record expired
		}
		got, err := s.c.Call(ctx, "t.rated", struct{}{}, executor.WithID(id))
		if err != nil || got.Status != envelope.StatusCompleted {
			t.Fatalf("%s, waiting at the rate past the record window: %v %+v", id, err, got)
		}
	}
	if n := calls.Load(); n != 3 {
		t.Errorf("%d handler calls, want 3", n)
	}
	if s := w.Stats(); s.Limited == 0 {
		t.Error("no call waited at the rate: the test proves nothing")
	}
}

// A call waiting for the slot lists as queued, not running, for as long as
// it waits, and its trail tells it in order: its request once, then the
// limit it waits at, then its run once the slot is free.
func TestLimits_AWaitingCallListsQueuedAndItsTrailBeginsWithItsRequest(t *testing.T) {
	t.Parallel()
	s := holdTheSlot(t)
	w, c, held := s.w, s.c, s.held
	ctx := ctxT(t)
	waiting, err := c.Submit(ctx, "t.ways", waysIn{})
	if err != nil {
		t.Fatal(err)
	}
	listed := func() string {
		page, err := c.Executions(ctx, executor.ExecutionsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range page.Entries {
			if e.ExecutionID == waiting {
				return e.Status
			}
		}
		return ""
	}
	waitUntil(t, "the waiting call listed", func() bool { return listed() != "" })
	// Back in its queue several times over: each return claims it again.
	waitUntil(t, "the waiting call back three times", func() bool { return w.Stats().Limited >= 3 })
	if got := listed(); got != audit.EntryQueued {
		t.Fatalf("the waiting call lists %q, want %q", got, audit.EntryQueued)
	}
	if _, err := c.Cancel(ctx, held); err != nil {
		t.Fatal(err)
	}
	if got, err := c.Await(ctx, waiting); err != nil || got.Status != envelope.StatusCompleted {
		t.Fatalf("the waiting call once the slot is free: %v %+v", err, got)
	}
	want := []string{audit.EventRequested, audit.EventLimited, audit.EventStarted, audit.EventCompleted}
	if types := typesOf(trail(t, c, waiting)); !slices.Equal(types, want) {
		t.Errorf("the waiting call's trail %v, want %v", types, want)
	}
	waitUntil(t, "the waiting call listed completed", func() bool { return listed() == audit.EntryCompleted })
}

// Sixty-four calls waiting for the slot each list queued (an entry each,
// sent alone), and completed once the slot is free: none is left listed as
// queued or running behind its end.
func TestLimits_ManyWaitingCallsListQueuedThenTheirEnds(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("sixty-four calls wait")
	}
	s := holdTheSlot(t)
	ctx := ctxT(t)
	var ids []string
	for range 64 {
		id, err := s.c.Submit(ctx, "t.ways", waysIn{})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	listed := func(status string) int {
		got := map[string]string{}
		req := executor.ExecutionsRequest{Query: audit.Query{Limit: audit.MaxLimit}}
		for {
			page, err := s.c.Executions(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range page.Entries {
				if _, ok := got[e.ExecutionID]; !ok {
					got[e.ExecutionID] = e.Status
				}
			}
			if page.Next == "" {
				break
			}
			req.Cursor = page.Next
		}
		n := 0
		for _, id := range ids {
			if got[id] == status {
				n++
			}
		}
		return n
	}
	waitUntil(t, "every waiting call listed queued", func() bool { return listed(audit.EntryQueued) == len(ids) })
	if _, err := s.c.Cancel(ctx, s.held); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if got, err := s.c.Await(ctx, id); err != nil || got.Status != envelope.StatusCompleted {
			t.Fatalf("%s: %v %+v", id, err, got)
		}
	}
	waitUntil(t, "every call listed completed", func() bool { return listed(audit.EntryCompleted) == len(ids) })
}
