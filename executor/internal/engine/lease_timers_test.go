package engine

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/broker"
)

// startedKeeper is a claim of a new record in state, with an hour's lease,
// and its lease keeper started, and the execution's context.
func startedKeeper(t *testing.T, state State) (*claim, *leaseKeeper, context.Context) {
	t.Helper()
	r := testRunner(t)
	id := envelope.NewExecutionID()
	mine := r.newClaim(broker.Key(broker.Anonymous, id))
	if _, _, ok := mine.create(claimRecord(id, "w1", mine.token, state, time.Now().Add(time.Hour)), noStage{}); !ok {
		t.Fatal("create")
	}
	ctx, end := context.WithCancelCause(context.Background())
	t.Cleanup(func() { end(nil) })
	l := &leaseKeeper{claim: mine, length: time.Hour, now: time.Now, end: end, lost: end, log: slog.New(slog.DiscardHandler),
		done: make(chan struct{}), stop: make(chan struct{})}
	l.start()
	return mine, l, ctx
}

// An execution that ends before its renewals start leaves no timer armed:
// the lease's end is not armed while the lease outlasts the renewals' start,
// and disarming stops the renewals.
func TestLeaseKeeper_QuickExecution_ArmsOneTimerAndLeavesNone(t *testing.T) {
	t.Parallel()
	mine, l, ctx := startedKeeper(t, StateRunning)
	// A write of the claim (a state's change) moves the lease, not the timers.
	if err := mine.update(func(rec *Record) { rec.State = StateRunning }); err != nil {
		t.Fatal(err)
	}
	l.mu.Lock()
	expiry, starter := l.expiry, l.starter
	l.mu.Unlock()
	if expiry != nil || starter == nil {
		t.Fatalf("expiry armed %v, renewals' start armed %v: want the renewals' start alone", expiry != nil, starter != nil)
	}
	l.halt()
	if starter.Stop() {
		t.Fatal("the renewals' start is still armed after halt")
	}
	if ctx.Err() != nil {
		t.Fatalf("the execution's context ended: %v", context.Cause(ctx))
	}
}

// A claim given back (an operator's pause, a limit's wait) writes a lease
// that ends now, after its keeper halted: that is no lease running out, and
// nothing ends the execution as lost.
func TestLeaseKeeper_GiveBackAfterHalt_IsNoLeaseRunningOut(t *testing.T) {
	t.Parallel()
	mine, l, ctx := startedKeeper(t, StateClaimed)
	l.halt()
	if err := mine.update(func(rec *Record) { rec.LeaseUntil, rec.Worker = time.Now().UTC(), "" }); err != nil {
		t.Fatal(err)
	}
	l.mu.Lock()
	expiry := l.expiry
	l.mu.Unlock()
	if expiry != nil {
		t.Fatal("the lease's end was armed by a give-back after halt")
	}
	if ctx.Err() != nil || mine.lapsed.Load() {
		t.Fatalf("the execution's context: %v, lapsed %v: want neither", context.Cause(ctx), mine.lapsed.Load())
	}
}
