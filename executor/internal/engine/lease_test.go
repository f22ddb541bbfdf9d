package engine

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/internal/broker"
)

// The lease keeper's rules on a real store (DESIGN §5): a lease that runs
// out unrenewed ends the execution before another worker may take it over;
// a renewal moves the lease; a renewal that finds a cancel recorded ends
// the execution as the caller's cancel.

// keeper is a lease keeper of c whose renewals start only when the test
// renews, and the end of the execution's context.
func keeper(c *claim, length time.Duration) (*leaseKeeper, context.Context) {
	ctx, end := context.WithCancelCause(context.Background())
	return &leaseKeeper{claim: c, length: length, now: time.Now, end: end, lost: end, log: slog.New(slog.DiscardHandler),
		stop: make(chan struct{}), done: make(chan struct{})}, ctx
}

func TestLease_RunningOutUnrenewed_EndsTheExecution(t *testing.T) {
	t.Parallel()
	c := &claim{key: "k", token: "t"}
	c.hold(&Record{Claim: "t", LeaseUntil: time.Now().Add(50 * time.Millisecond)}, 1)
	// An hour's lease: its first renewal is twenty minutes away; the record
	// held says the lease ends sooner, and that is when the execution ends.
	l, ctx := keeper(c, time.Hour)
	l.start()
	defer l.halt()
	select {
	case <-ctx.Done():
	case <-time.After(20 * time.Second):
		t.Fatal("the execution goes on after its lease ran out unrenewed")
	}
	if !errors.Is(context.Cause(ctx), errLeaseLost) || !c.lapsed.Load() {
		t.Fatalf("ended with %v (lapsed %v), want errLeaseLost and the claim lapsed", context.Cause(ctx), c.lapsed.Load())
	}
}

func TestLease_RenewalMovesTheLease(t *testing.T) {
	t.Parallel()
	r := testRunner(t)
	before := time.Now().Add(time.Minute)
	_, key, mine := r.runningClaim(t, before)
	l, ctx := keeper(mine, time.Hour)
	if !l.renew() || ctx.Err() != nil {
		t.Fatalf("a renewal of this worker's claim stopped it (%v)", context.Cause(ctx))
	}
	got, _, err := r.w.store.load(key)
	if err != nil || !got.LeaseUntil.After(before.Add(30*time.Minute)) {
		t.Fatalf("record %+v (%v): the lease was not renewed for its length", got, err)
	}
}

func TestLease_RenewalFindingACancel_EndsTheExecutionAsCancelled(t *testing.T) {
	t.Parallel()
	r := testRunner(t)
	id, _, mine := r.runningClaim(t, time.Now().Add(time.Minute))
	if _, err := r.RecordCancel(broker.Anonymous, id, true); err != nil {
		t.Fatal(err)
	}
	l, ctx := keeper(mine, time.Hour)
	l.renew()
	if !errors.Is(context.Cause(ctx), errCallerCancelled) {
		t.Fatalf("the execution's context: %v, want ended by the caller's cancel", context.Cause(ctx))
	}
}
