package engine

import (
	"context"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/observe"
)

// The rules an execution carries out itself, on a real store and trail:
// what its trail files and when, how long an attempt may run, how it writes
// its end (DESIGN §5, §8, §14).

// testExecution is an execution of a new request on r's store, of c (nil:
// none), not delivered, its context open.
func testExecution(t *testing.T, r *Runner, c Definition) *execution {
	t.Helper()
	req := &envelope.Request{ExecutionID: envelope.NewExecutionID(), CapabilityID: testOp, Input: mustRaw(map[string]any{"n": 1})}
	x := newExecution(r.w, req, broker.Anonymous, Delivery{ID: req.ExecutionID})
	x.cap, x.obs = c, observe.NopExecution{}
	x.ctx, x.cancel = context.WithCancelCause(context.Background())
	t.Cleanup(func() { x.cancel(nil) })
	return x
}

// trailOf is the types of x's events on the trail, once sent.
func trailOf(t *testing.T, r *Runner, x *execution) []string {
	return trailTypes(t, r, x.req.ExecutionID)
}

// A claim that found another record files nothing of what it held: the
// execution the record is of has its own trail.
func TestTrail_ClaimThatFoundAnotherRecord_FilesNothing(t *testing.T) {
	t.Parallel()
	r := testRunner(t)
	x := testExecution(t, r, nil)
	x.trail.hold()
	x.unaudited = true
	x.audited()
	x.yield() // the store "did not answer": no record found, a later delivery decides
	x.emit(audit.EventDuplicateDelivery, nil)
	if got := trailOf(t, r, x); len(got) != 1 || got[0] != audit.EventDuplicateDelivery {
		t.Fatalf("trail %v: the events held before the claim were filed", got)
	}
}

// The request is audited once per execution, however often the pipeline
// asks (stage 2).
func TestTrail_RequestedFiledOnce(t *testing.T) {
	t.Parallel()
	r := testRunner(t)
	x := testExecution(t, r, nil)
	x.unaudited = true
	x.audited()
	x.audited()
	x.unaudited = false // a takeover: this delivery did not claim it fresh
	x.audited()
	if got := trailOf(t, r, x); count(got, audit.EventRequested) != 1 {
		t.Fatalf("trail %v: want one capability.requested", got)
	}
}

// Events held while an attempt starts are filed soon after, not at its end:
// a long handler's trail shows it started.
func TestTrail_HeldEventsFiledWhileALongAttemptRuns(t *testing.T) {
	t.Parallel()
	r := testRunner(t)
	x := testExecution(t, r, nil)
	x.trail.hold()
	x.emit(audit.EventStarted, nil)
	x.trail.flushSoon()
	deadline := time.Now().Add(20 * time.Second)
	for count(trailOf(t, r, x), audit.EventStarted) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("capability.started still held while the attempt runs")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A flush queued for one holding (flushSoon) does nothing to the trail once
// that holding has ended: events held since are kept for their own end.
func TestTrail_QueuedFlushOfAnEndedHoldingDoesNothing(t *testing.T) {
	t.Parallel()
	r := testRunner(t)
	x := testExecution(t, r, nil)
	x.trail.hold()
	x.emit(audit.EventStarted, nil)
	queued := x.trail.gen
	x.trail.flushSoon()
	x.trail.flush() // the execution ended first
	x.trail.hold()
	x.emit(audit.EventCompleted, nil)
	x.trail.flushHeld(queued)
	x.trail.mu.Lock()
	held, holding := len(x.trail.held), x.trail.holding
	x.trail.mu.Unlock()
	if held != 1 || !holding {
		t.Fatalf("after a stale queued flush: %d events held, holding %v; want the later event still held", held, holding)
	}
	x.trail.flushHeld(x.trail.gen)
	deadline := time.Now().Add(20 * time.Second)
	for got := trailOf(t, r, x); count(got, audit.EventCompleted) == 0 || count(got, audit.EventStarted) != 1; got = trailOf(t, r, x) {
		if time.Now().After(deadline) {
			t.Fatalf("trail %v: want one capability.started, then the completion flushed by its own holding", got)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// An attempt's timeout is its own, counted from its start: an attempt that
// starts long after its execution began has its whole timeout.
func TestAttempt_TimeoutCountsFromTheAttemptsStart(t *testing.T) {
	t.Parallel()
	r := testRunner(t)
	c := &testCap{work: func(ctx context.Context, _ Attempt) (any, error) { return "ok", ctx.Err() }}
	x := testExecution(t, r, c)
	x.start = time.Now().Add(-time.Hour) // a retry an hour after the first attempt
	at := &attempts{x: x, unit: testUnit{c}}
	at.receipts.x = x
	if out, cerr := at.call(2, time.Minute); cerr != nil || out != "ok" {
		t.Fatalf("an attempt of a minute's timeout, an hour into its execution: %v, %+v", out, cerr)
	}
}

// After a timeout the handler's late result is neither waited for nor used:
// the attempt ends TIMEOUT when its time is up.
func TestAttempt_LateResultNotUsed(t *testing.T) {
	t.Parallel()
	r := testRunner(t)
	release := make(chan struct{})
	defer close(release)
	c := &testCap{timeout: 50 * time.Millisecond, work: func(ctx context.Context, _ Attempt) (any, error) {
		<-ctx.Done()
		<-release // returns only once the test is over
		return "late", nil
	}}
	x := testExecution(t, r, c)
	at := &attempts{x: x, unit: testUnit{c}}
	at.receipts.x = x
	done := make(chan struct{})
	var cerr *envelope.CapabilityError
	var out any
	go func() {
		defer close(done)
		out, cerr = at.call(1, c.timeout)
	}()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the attempt waits for its handler after its timeout")
	}
	if cerr == nil || cerr.Code != envelope.CodeTimeout || out != nil {
		t.Fatalf("attempt after its timeout: %v, %+v; want TIMEOUT and no output", out, cerr)
	}
}
