package engine

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/internal/broker"
)

// The reconciler asked about an attempt lost with its worker runs under a
// context that the caller's cancel does not end (no cancel stops the lost
// attempt, and the answer says what became of it), and that what ends the
// claim still ends once a cancel came: the claim taken by another worker,
// or the worker's shutdown.
func TestReconcile_ACancelDoesNotEndItTheClaimsLossAndShutdownDo(t *testing.T) {
	t.Parallel()
	for _, end := range []string{"claim taken", "shutdown"} {
		t.Run(end, func(t *testing.T) {
			t.Parallel()
			asked := make(chan context.Context, 1)
			c := &testCap{recovery: Recovery{Reconciles: true, Timeout: time.Hour},
				reconcile: func(ctx context.Context) Reconciliation {
					asked <- ctx
					<-ctx.Done()
					return Reconciliation{Verdict: Inconclusive, Err: context.Cause(ctx)}
				}}
			g := newRig(t, c, func(cfg *Config) { cfg.Lease = time.Second })
			req := g.request()
			lost := g.othersClaim(req, StateRunning, time.Now().Add(-time.Minute))
			if err := lost.update(func(r *Record) { r.Attempt, r.StartedAt = 1, time.Now().UTC().Add(-time.Minute) }); err != nil {
				t.Fatal(err)
			}
			g.publish(req)
			handled := make(chan struct{})
			go func() { defer close(handled); g.handle(g.next()) }()
			var ctx context.Context
			select {
			case ctx = <-asked:
			case <-ctxT(t).Done():
				t.Fatal("the reconciler was never asked")
			}
			write := func(change func(r *Record)) {
				t.Helper()
				for ctx := ctxT(t); ctx.Err() == nil; {
					rec, rev, err := g.r.w.store.load(g.key(req))
					if err != nil {
						t.Fatal(err)
					}
					change(rec)
					if _, err := g.r.w.store.swap(g.key(req), rec, rev); err == nil {
						return
					}
					// A renewal of the lease wrote it meanwhile: read it again.
				}
				t.Fatal("the record was never written")
			}
			write(func(r *Record) { r.CancelRequested, r.CancelRequestedAt = true, time.Now().UTC() })
			g.r.CancelLocal(broker.Anonymous, req.ExecutionID)
			if err := ctx.Err(); err != nil {
				t.Fatalf("the caller's cancel cut the reconciler off: %v", context.Cause(ctx))
			}
			want := errLeaseLost
			switch end {
			case "claim taken":
				write(func(r *Record) { r.Claim, r.Worker = "another-claim", "w-another" })
			case "shutdown":
				g.r.Stop()
				want = errShutdown
			}
			select {
			case <-ctx.Done():
				if cause := context.Cause(ctx); !errors.Is(cause, want) {
					t.Errorf("the reconciler's context ended by %v, want %v", cause, want)
				}
			case <-ctxT(t).Done():
				t.Fatalf("the reconciler ran on after the %s", end)
			}
			<-handled
		})
	}
}
