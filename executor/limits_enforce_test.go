package executor_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/capstantest"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
)

// running counts a handler's calls running at once, and the most seen.
type running struct{ now, most, calls atomic.Int64 }

func (r *running) enter() {
	r.calls.Add(1)
	n := r.now.Add(1)
	for m := r.most.Load(); n > m && !r.most.CompareAndSwap(m, n); m = r.most.Load() {
	}
}

func (r *running) leave() { r.now.Add(-1) }

func limited(id string, run *running, hold time.Duration, ls ...executor.Limit) executor.Capability {
	return executor.Define(id, executor.Meta{Description: "Counts its calls.", Expose: executor.On(executor.SurfaceDirect),
		SideEffect: executor.SideEffectWrite, Limits: ls},
		func(ctx context.Context, call executor.Call[struct {
			N int64 `json:"n"`
		}]) (int64, error) {
			run.enter()
			defer run.leave()
			time.Sleep(hold)
			return call.Input.N, nil
		})
}

// Three workers serve a capability that may run twice at once; 24 callers
// call it together: every call completes, and no moment sees a third
// handler running, whichever workers run them.
func TestLimits_ConcurrencyHoldsAcrossWorkers(t *testing.T) {
	t.Parallel()
	run := &running{}
	reg, err := executor.NewRegistry(limited("t.slots", run, 20*time.Millisecond,
		executor.Limit{Kind: executor.LimitConcurrency, Max: 2}))
	if err != nil {
		t.Fatal(err)
	}
	w := trackedWorker(t, reg)
	for range 2 {
		trackedWorker(t, reg, capstantest.WithConn(w.Connect(t)))
	}
	c := w.Client(t, executor.ClientConfig{Actor: alice})
	reqs := make([]executor.Request, 24)
	for i := range reqs {
		reqs[i] = executor.Request{CapabilityID: "t.slots", Input: map[string]int{"n": i}}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	envs, errs := c.CallMany(ctx, reqs)
	for i := range envs {
		if errs[i] != nil || envs[i].Status != envelope.StatusCompleted {
			t.Fatalf("call %d: %v %+v", i, errs[i], envs[i])
		}
	}
	if most := run.most.Load(); most > 2 {
		t.Errorf("%d handlers ran at once, limit 2", most)
	}
	if calls := run.calls.Load(); calls != 24 {
		t.Errorf("%d handler calls for 24 calls", calls)
	}
}

// A rate per actor whose choice is to refuse: the third call of an actor in
// the hour ends RATE_LIMITED, not run, and the model is told when to try
// again; another actor's calls are counted apart.
func TestLimits_RateRefusesWithRetryAfter(t *testing.T) {
	t.Parallel()
	run := &running{}
	reg, err := executor.NewRegistry(limited("t.rate", run, 0,
		executor.Limit{Kind: executor.LimitRate, Per: executor.LimitPerActor, Max: 2, Interval: time.Hour, AtLimit: executor.AtLimitRefuse}))
	if err != nil {
		t.Fatal(err)
	}
	w := trackedWorker(t, reg)
	ann := w.Client(t, executor.ClientConfig{Actor: alice})
	for i := range 2 {
		if env, err := ann.Call(t.Context(), "t.rate", map[string]int{"n": i}); err != nil || env.Status != envelope.StatusCompleted {
			t.Fatalf("call %d within the rate: %v %+v", i, err, env)
		}
	}
	env, err := ann.Call(t.Context(), "t.rate", map[string]int{"n": 3})
	if err != nil || env.Status != envelope.StatusFailed || env.Error == nil || env.Error.Code != envelope.CodeRateLimited {
		t.Fatalf("third call: %v %+v", err, env)
	}
	m := env.ForModel()
	if ms := asInt(m.Details["retryAfterMs"]); ms <= 0 || ms > time.Hour.Milliseconds() {
		t.Errorf("the model is shown %+v, want a retryAfterMs within the hour", m)
	}
	if !m.Retryable {
		t.Errorf("a rate's refusal is not retryable for the model: %+v", m)
	}
	// Its trail begins with the request, as every execution's does: the
	// limit that refused it comes after, then its end.
	if types := typesOf(trail(t, ann, env.ExecutionID)); !slices.Equal(types, []string{audit.EventRequested, audit.EventLimited, audit.EventFailed}) {
		t.Errorf("the refused call's trail %v, want requested, limited, failed", types)
	}
	bob := w.Client(t, executor.ClientConfig{Actor: envelope.Actor{Kind: "user", ID: "bob"}})
	if env, err := bob.Call(t.Context(), "t.rate", map[string]int{"n": 4}); err != nil || env.Status != envelope.StatusCompleted {
		t.Fatalf("another actor's call: %v %+v", err, env)
	}
	if calls := run.calls.Load(); calls != 3 {
		t.Errorf("%d handler calls, want 3 (the refused one never ran)", calls)
	}
}

// A call that waits for a slot waits only until its start deadline: then
// it ends NOT_STARTED, never run.
func TestLimits_WaitEndsAtTheStartDeadline(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	var calls atomic.Int64
	slow := executor.Define("t.wait", executor.Meta{Description: "Holds its slot.", Expose: executor.On(executor.SurfaceDirect),
		SideEffect: executor.SideEffectWrite, Limits: []executor.Limit{{Kind: executor.LimitConcurrency, Max: 1}}},
		func(ctx context.Context, call executor.Call[struct{}]) (string, error) {
			calls.Add(1)
			select {
			case <-release:
			case <-ctx.Done():
			}
			return "done", nil
		})
	reg, err := executor.NewRegistry(slow)
	if err != nil {
		t.Fatal(err)
	}
	w := trackedWorker(t, reg)
	c := w.Client(t, executor.ClientConfig{Actor: alice})
	first := make(chan *envelope.Envelope, 1)
	go func() {
		env, _ := c.Call(context.Background(), "t.wait", struct{}{})
		first <- env
	}()
	for calls.Load() == 0 {
		time.Sleep(5 * time.Millisecond)
	}
	env, err := c.Call(t.Context(), "t.wait", struct{}{}, executor.StartWithin(time.Second))
	close(release)
	if err != nil || env.Status != envelope.StatusFailed || env.Error == nil || env.Error.Code != envelope.CodeNotStarted {
		t.Fatalf("the waiting call: %v %+v", err, env)
	}
	if env := <-first; env == nil || env.Status != envelope.StatusCompleted {
		t.Fatalf("the first call: %+v", env)
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("%d handler calls, want 1", n)
	}
	// The slot was given back: a third call runs.
	if env, err := c.Call(t.Context(), "t.wait", struct{}{}, executor.StartWithin(30*time.Second)); err != nil || env.Status != envelope.StatusCompleted {
		t.Fatalf("after the first ended: %v %+v", err, env)
	}
}

// Twenty racing calls of 150 against a budget of 2,000 per actor: thirteen
// run, the others end RATE_LIMITED; the sum run never passes the budget.
func TestLimits_RacingCallsNeverPassABudget(t *testing.T) {
	t.Parallel()
	run := &running{}
	var sum atomic.Int64
	amount := func(in any) (int64, error) {
		n := *(in.(*struct {
			N int64 `json:"n"`
		}))
		return n.N, nil
	}
	refund := executor.Define("t.refund", executor.Meta{Description: "Refunds.", Expose: executor.On(executor.SurfaceDirect),
		SideEffect: executor.SideEffectWrite, Limits: []executor.Limit{{Kind: executor.LimitBudget, Per: executor.LimitPerActor, Name: "amount",
			Max: 2000, Interval: 24 * time.Hour, Amount: amount, AtLimit: executor.AtLimitRefuse}}},
		func(ctx context.Context, call executor.Call[struct {
			N int64 `json:"n"`
		}]) (int64, error) {
			run.enter()
			defer run.leave()
			sum.Add(call.Input.N)
			return call.Input.N, nil
		})
	reg, err := executor.NewRegistry(refund)
	if err != nil {
		t.Fatal(err)
	}
	w := trackedWorker(t, reg)
	trackedWorker(t, reg, capstantest.WithConn(w.Connect(t)))
	c := w.Client(t, executor.ClientConfig{Actor: alice})
	var wg sync.WaitGroup
	var done, refused atomic.Int64
	for range 20 {
		wg.Go(func() {
			env, err := c.Call(t.Context(), "t.refund", map[string]int{"n": 150})
			switch {
			case err != nil:
				t.Error(err)
			case env.Status == envelope.StatusCompleted:
				done.Add(1)
			case env.Error != nil && env.Error.Code == envelope.CodeRateLimited:
				refused.Add(1)
			default:
				t.Errorf("%+v", env)
			}
		})
	}
	wg.Wait()
	if sum.Load() > 2000 || done.Load() != 13 || refused.Load() != 7 {
		t.Errorf("ran %d (sum %d), refused %d; want 13 (1,950) and 7", done.Load(), sum.Load(), refused.Load())
	}
	// A refund alone over the budget is refused, and not retryable.
	env, err := c.Call(t.Context(), "t.refund", map[string]int{"n": 2001})
	if err != nil || env.Error == nil || env.Error.Code != envelope.CodeRateLimited || env.Error.Retryable {
		t.Fatalf("an amount over the whole budget: %v %+v", err, env)
	}
	if errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
}

// asInt reads a number of decoded details, whatever width it came as.
func asInt(v any) int64 {
	switch n := v.(type) {
	case int64:
		return n
	case int:
		return int64(n)
	case uint64:
		return int64(n)
	case uint32:
		return int64(n)
	case int32:
		return int64(n)
	case int8:
		return int64(n)
	case uint8:
		return int64(n)
	case int16:
		return int64(n)
	case uint16:
		return int64(n)
	case float64:
		return int64(n)
	}
	return -1
}

// A budget whose choice at its limit is an approval: the call over it asks
// a human, with the limit as its reason; the approval binds the input, so
// the amount; the resume runs once, charged past the budget, and the next
// call over it asks again.
func TestLimits_BudgetOverItsMaximumAsksForAnApproval(t *testing.T) {
	t.Parallel()
	run := &running{}
	amount := func(in any) (int64, error) {
		return in.(*struct {
			N int64 `json:"n"`
		}).N, nil
	}
	reg, err := executor.NewRegistry(limited("t.pay", run, 0, executor.Limit{Kind: executor.LimitBudget, Per: executor.LimitPerActor,
		Name: "amount", Max: 1000, Interval: 24 * time.Hour, Amount: amount, AtLimit: executor.AtLimitApproval}))
	if err != nil {
		t.Fatal(err)
	}
	w := trackedWorker(t, reg)
	c := w.Client(t, executor.ClientConfig{Actor: alice})
	if env, err := c.Call(t.Context(), "t.pay", map[string]int{"n": 600}); err != nil || env.Status != envelope.StatusCompleted {
		t.Fatalf("within the budget: %v %+v", err, env)
	}
	env, err := c.Call(t.Context(), "t.pay", map[string]int{"n": 600})
	if err != nil || env.Status != envelope.StatusApprovalRequired || env.Approval == nil {
		t.Fatalf("over the budget: %v %+v", err, env)
	}
	if len(env.Approval.Reasons) != 1 || env.Approval.Reasons[0] != "over its limit: amount 1000 per 24h per actor" {
		t.Errorf("the approver is told %q", env.Approval.Reasons)
	}
	if _, err := c.Decide(t.Context(), env.Approval.ID, approvals.Verdict{Approve: true,
		Approver: envelope.Actor{Kind: "user", ID: "bob"}}); err != nil {
		t.Fatal(err)
	}
	resumed, err := c.Resume(t.Context(), env.Approval.ID)
	if err != nil || resumed.Status != envelope.StatusCompleted {
		t.Fatalf("the approved call: %v %+v", err, resumed)
	}
	if again, err := c.Resume(t.Context(), env.Approval.ID); err != nil || again.Error == nil || again.Error.Code != envelope.CodeApprovalConsumed {
		t.Fatalf("the approval used twice: %v %+v", err, again)
	}
	if env, err := c.Call(t.Context(), "t.pay", map[string]int{"n": 1}); err != nil || env.Status != envelope.StatusApprovalRequired {
		t.Fatalf("after the approved call, the budget is spent: %v %+v", err, env)
	}
	if n := run.calls.Load(); n != 2 {
		t.Errorf("%d handler calls, want 2", n)
	}
}

// A rate whose choice is to wait, across three workers: 100 calls of a
// capability allowed 20 a second all complete, and their handlers never
// start faster than the rate allows (a burst of 20, then one every 50 ms):
// the starts after the burst number at most what the time they took allows.
func TestLimits_RateWaitsAcrossWorkers(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var starts []time.Time
	rated := executor.Define("t.rated", executor.Meta{Description: "Rated.", Expose: executor.On(executor.SurfaceDirect),
		SideEffect: executor.SideEffectWrite, Limits: []executor.Limit{{Kind: executor.LimitRate, Max: 20, Interval: time.Second}}},
		func(ctx context.Context, call executor.Call[struct {
			N int `json:"n"`
		}]) (int, error) {
			mu.Lock()
			starts = append(starts, time.Now())
			mu.Unlock()
			return call.Input.N, nil
		})
	reg, err := executor.NewRegistry(rated)
	if err != nil {
		t.Fatal(err)
	}
	w := trackedWorker(t, reg)
	for range 2 {
		trackedWorker(t, reg, capstantest.WithConn(w.Connect(t)))
	}
	c := w.Client(t, executor.ClientConfig{Actor: alice})
	reqs := make([]executor.Request, 100)
	for i := range reqs {
		reqs[i] = executor.Request{CapabilityID: "t.rated", Input: map[string]int{"n": i}}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	envs, errs := c.CallMany(ctx, reqs)
	for i := range envs {
		if errs[i] != nil || envs[i].Status != envelope.StatusCompleted {
			t.Fatalf("call %d: %v %+v", i, errs[i], envs[i])
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(starts) != 100 {
		t.Fatalf("%d handler calls for 100 calls", len(starts))
	}
	slices.SortFunc(starts, func(a, b time.Time) int { return a.Compare(b) })
	// After the burst of 20, one every 50 ms: the last 80 starts span at
	// least 79 emissions, less the time between an admission and its
	// handler's start (a scheduling delay, bounded here by a generous 1 s).
	if span := starts[99].Sub(starts[20]); span < 79*50*time.Millisecond-time.Second {
		t.Errorf("the 80 calls after the burst started within %v: faster than 20 a second", span)
	}
}

// A call that waits for a slot is left with no worker named, and the
// delivery that later runs it resumes it: its trail says it was limited
// (once, however often it came back to wait), then started and completed, and never that it was taken over from a
// worker (which would tell an operator of a lost worker that never was),
// even when a delivery had claimed it before it waited.
func TestLimits_AWaitIsNotATakeover(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	held := make(chan struct{}, 1)
	slot := executor.Define("t.slot", executor.Meta{Description: "Holds its slot until released.",
		Expose: executor.On(executor.SurfaceDirect), SideEffect: executor.SideEffectWrite,
		Limits: []executor.Limit{{Kind: executor.LimitConcurrency, Max: 1}}},
		func(ctx context.Context, call executor.Call[struct {
			Hold bool `json:"hold"`
		}]) (bool, error) {
			if call.Input.Hold {
				held <- struct{}{}
				select {
				case <-release:
				case <-ctx.Done():
					return false, ctx.Err()
				}
			}
			return call.Input.Hold, nil
		})
	reg, err := executor.NewRegistry(slot)
	if err != nil {
		t.Fatal(err)
	}
	w := trackedWorker(t, reg)
	c := w.Client(t, executor.ClientConfig{Actor: alice})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	first, err := c.Submit(ctx, "t.slot", map[string]bool{"hold": true})
	if err != nil {
		t.Fatal(err)
	}
	<-held
	second, err := c.Submit(ctx, "t.slot", map[string]bool{"hold": false})
	if err != nil {
		t.Fatal(err)
	}
	// The second waits for the slot, and comes back to wait again: a later
	// delivery claims the execution before it takes its limits, and gives
	// the claim back. Its trail says it waits once, not at each return.
	waitUntil(t, "the second call waits twice", func() bool { return w.Worker.Stats().Limited >= 2 })
	close(release)
	for _, id := range []string{first, second} {
		if env, err := c.Await(ctx, id); err != nil || env.Status != envelope.StatusCompleted {
			t.Fatalf("%s: %v %+v", id, err, env)
		}
	}
	types := typesOf(trail(t, c, second))
	for _, want := range []string{audit.EventRequested, audit.EventLimited, audit.EventStarted, audit.EventCompleted} {
		if !slices.Contains(types, want) {
			t.Errorf("trail %v has no %s", types, want)
		}
	}
	t.Logf("trail: %v", types)
	if n := len(slices.DeleteFunc(slices.Clone(types), func(s string) bool { return s != audit.EventLimited })); n != 1 {
		t.Errorf("trail %v says %d times that the call waited, want once", types, n)
	}
	if slices.Contains(types, audit.EventTakenOver) {
		t.Errorf("trail %v says the waiting call was taken over", types)
	}
}
