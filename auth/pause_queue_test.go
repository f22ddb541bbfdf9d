package auth_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/auth"
	"github.com/capstan-dev/capstan/capstantest"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/oplog"
	"github.com/capstan-dev/capstan/internal/pauses"
)

// An operator's pause of a principal holds that principal's calls in its own
// queue and nobody else's (DESIGN §3 Queues, §18): with alice paused and her
// calls delivered and put back again and again (unacknowledged deliveries of
// her queue's consumer), every one of them stays in her queue, none runs,
// and each of bob's calls, made meanwhile, completes; once she is unpaused,
// each of hers runs once.
// With alice's and bob's real credentials, on both servers.
func TestQueue_APausedPrincipalHoldsItsOwnQueueAlone(t *testing.T) {
	t.Parallel()
	onEachServer(t, testPausedPrincipalHoldsItsOwnQueue)
}

func testPausedPrincipalHoldsItsOwnQueue(t *testing.T, r *rig) {
	const (
		concurrency = 2
		held        = 200
		bobs        = 20
		scope       = "alice"
	)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	var mu sync.Mutex
	calls := map[string]int{} // handler calls per execution
	perActor := map[string]int{}
	count := executor.Define("t.count", executor.Meta{
		Description: "Counts its calls.", Expose: executor.On(executor.SurfaceDirect), SideEffect: executor.SideEffectExternal,
	}, func(ctx context.Context, c executor.Call[Echo]) (Echo, error) {
		mu.Lock()
		calls[c.ExecutionID]++
		perActor[c.Actor.ID]++
		mu.Unlock()
		return c.Input, nil
	})
	reg, err := executor.NewRegistry(count)
	if err != nil {
		t.Fatal(err)
	}
	w := capstantest.Worker(t, reg, capstantest.WithConn(r.connect(t, auth.WorkerPrincipal)),
		capstantest.WithConfig(executor.WorkerConfig{Pool: "paused", Concurrency: concurrency, SweepInterval: -1, CatalogTTL: time.Hour, Grace: time.Second}))

	n := broker.NewNames(r.setup.Prefix)
	ch, err := pauses.Apply(ctx, r.admin.NC, n, &pauses.Pause{Scope: pauses.Scope{Principal: scope}, Mode: pauses.Hold,
		Reason: "alice's agent loops", By: auth.AdminPrincipal})
	if err != nil {
		t.Fatal(err)
	}
	replies, err := oplog.Confirm(ctx, r.admin.NC, n, oplog.Pauses, ch.Revision, "", 5*time.Second)
	if err != nil || len(replies) != 2 {
		t.Fatalf("confirmations %v %+v, want the rig's worker and this one", err, replies)
	}
	for _, rep := range replies {
		if !rep.Applied {
			t.Fatalf("worker %s did not apply the pause: %+v", rep.Worker, rep)
		}
	}

	alice, _, _ := r.client(t, "alice", executor.SurfaceDirect)
	bob, _, _ := r.client(t, "bob", executor.SurfaceDirect)
	ids := make([]string, held)
	for i := range ids {
		if ids[i], err = alice.Submit(ctx, "t.count", Echo{Text: fmt.Sprint(i)}); err != nil {
			t.Fatalf("alice's call %d: %v", i, err)
		}
	}
	// Every held call delivered and put back twice, on average.
	for w.Stats().Held < 2*held {
		select {
		case <-ctx.Done():
			t.Fatalf("alice's calls never held: %+v", w.Stats())
		case <-time.After(20 * time.Millisecond):
		}
	}
	for i := range bobs {
		if env, err := bob.Call(ctx, "t.count", Echo{Text: fmt.Sprint("bob ", i)}); err != nil || env.Status != envelope.StatusCompleted {
			t.Fatalf("bob's call %d while alice is paused: %v %+v", i, err, env)
		}
	}
	mu.Lock()
	ran := perActor["alice"]
	mu.Unlock()
	if ran != 0 {
		t.Fatalf("%d of alice's calls ran while she was paused", ran)
	}
	if got := r.queueDepth(t, "alice"); got != held {
		t.Fatalf("alice's queue holds %d requests while she is paused, want her %d", got, held)
	}

	if _, err := pauses.Lift(ctx, r.admin.NC, n, pauses.Scope{Principal: scope}, auth.AdminPrincipal, "", "fixed"); err != nil {
		t.Fatal(err)
	}
	for i, id := range ids {
		env, err := alice.Await(ctx, id)
		if err != nil || env.Status != envelope.StatusCompleted || env.Attempts != 1 {
			t.Fatalf("alice's call %d after the pause: %v %+v", i, err, env)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, id := range ids {
		if calls[id] != 1 {
			t.Errorf("alice's execution %s: %d handler calls, want 1", id, calls[id])
		}
	}
	if perActor["alice"] != held || perActor["bob"] != bobs {
		t.Errorf("handler calls: %v, want alice %d and bob %d", perActor, held, bobs)
	}
}
