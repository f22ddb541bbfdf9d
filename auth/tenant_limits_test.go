package auth_test

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/auth"
	"github.com/capstan-dev/capstan/capstantest"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
)

// HoldInput is t.mine's and t.all's input: hold until cancelled, or return.
type HoldInput struct {
	Hold bool `json:"hold,omitempty"`
}

// Alice fills her own limits of t.mine (one running per principal, one per
// actor), calling as bob's user: her other calls wait, and bob's calls of
// t.mine, as that same user, start and complete while they do. Her forged
// request on bob's subject is refused by the server. t.all's limit, the
// capability's own, is the exception the design states: alice's call holds
// it, so bob's waits until hers ends.
func TestTenant_APrincipalsLimitsHoldItsOwnCallsAlone(t *testing.T) {
	t.Parallel()
	e, admin := securedTenants(t)
	ctx := testCtx(t)
	var started atomic.Int64
	hold := func(ctx context.Context, c executor.Call[HoldInput]) (string, error) {
		started.Add(1)
		if c.Input.Hold {
			<-ctx.Done()
			return "", ctx.Err()
		}
		return "ran", nil
	}
	meta := func(ls ...executor.Limit) executor.Meta {
		return executor.Meta{Description: "Holds until cancelled.", Expose: executor.On(executor.SurfaceDirect),
			SideEffect: executor.SideEffectWrite, Timeout: 10 * time.Minute, Limits: ls}
	}
	reg, err := executor.NewRegistry(
		executor.Define("t.mine", meta(
			executor.Limit{Kind: executor.LimitConcurrency, Per: executor.LimitPerPrincipal, Max: 1},
			executor.Limit{Kind: executor.LimitConcurrency, Per: executor.LimitPerActor, Max: 1}), hold),
		executor.Define("t.all", meta(executor.Limit{Kind: executor.LimitConcurrency, Max: 1}), hold))
	if err != nil {
		t.Fatal(err)
	}
	capstantest.Worker(t, reg, capstantest.WithConn(e.ConnectAs(t, auth.WorkerPrincipal)),
		capstantest.WithConfig(executor.WorkerConfig{Pool: "tenant", Lease: 2 * time.Second, Concurrency: 8}))
	client := func(principal string) *executor.Client {
		c, err := executor.NewClient(e.ConnectAs(t, principal), executor.ClientConfig{Actor: envelope.Actor{Kind: envelope.ActorUser, ID: "bob"}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	alice, bob := client("alice"), client("bob")
	trailTypes := func(principal, id string) []string {
		ev, err := audit.Read(ctx, admin.NC, admin.Names.Prefix(), principal, id)
		if err != nil {
			return nil
		}
		var types []string
		for _, x := range ev {
			types = append(types, x.Type)
		}
		return types
	}

	alices := holding(t, ctx, alice, "t.mine", 3)
	waitFor(t, "one of alice's calls runs, the others wait at her limit", func() bool {
		running, waiting := 0, 0
		for _, id := range alices {
			types := trailTypes("alice", id)
			switch {
			case slices.Contains(types, audit.EventStarted):
				running++
			case slices.Contains(types, audit.EventLimited):
				waiting++
			}
		}
		return running == 1 && waiting == 2
	})
	for range 3 {
		if env, err := bob.Call(ctx, "t.mine", HoldInput{}); err != nil || env.Status != envelope.StatusCompleted {
			t.Fatalf("bob's call beside alice's: %v %+v", err, env)
		}
	}
	running := 0
	for _, id := range alices {
		if slices.Contains(trailTypes("alice", id), audit.EventStarted) {
			running++
		}
	}
	if running != 1 {
		t.Errorf("%d of alice's calls started, want 1: bob's calls took nothing of hers", running)
	}

	// A request forged on bob's subject never reaches his queue.
	req, err := envelope.Marshal(envelope.Request{ExecutionID: envelope.NewExecutionID(), CapabilityID: "t.mine",
		Input: envelope.Raw(`{"hold":true}`)})
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(e.ConnectAs(t, "alice"))
	if err != nil {
		t.Fatal(err)
	}
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	_, err = js.Publish(pctx, admin.Names.ExecSubject("bob", "t.mine"), req)
	cancel()
	if err == nil {
		t.Fatal("alice published a request on bob's subject")
	}

	// The capability's own limit is shared: alice's call holds it, bob's waits.
	held := holding(t, ctx, alice, "t.all", 1)[0]
	waitFor(t, "alice's t.all runs", func() bool { return slices.Contains(trailTypes("alice", held), audit.EventStarted) })
	waiting, err := bob.Submit(ctx, "t.all", HoldInput{})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "bob's t.all waits at the capability's limit", func() bool {
		return slices.Contains(trailTypes("bob", waiting), audit.EventLimited)
	})
	if _, err := alice.Cancel(ctx, held); err != nil {
		t.Fatal(err)
	}
	if env, err := bob.Await(ctx, waiting); err != nil || env.Status != envelope.StatusCompleted {
		t.Fatalf("bob's t.all once alice's ended: %v %+v", err, env)
	}
}

// Alice, alone at first, sends more long calls than a worker has slots;
// then bob calls. Bob's call starts and completes while every one of
// alice's still runs or waits: a worker serving several principals' queues
// keeps its reserve of slots (an eighth, at least one) from any one of
// them, even before another has sent anything.
func TestTenant_LongCallsOfOnePrincipalLeaveTheReserveToTheOthers(t *testing.T) {
	t.Parallel()
	const slots = 4
	client, running, most := longCallsWorker(t, slots)
	alice, bob := client("alice"), client("bob")
	ctx := testCtx(t)
	holding(t, ctx, alice, "t.long", 2*slots)
	waitFor(t, "alice's calls take what she may of the worker", func() bool { return running.Load() >= slots-1 })
	if env, err := bob.Call(ctx, "t.long", HoldInput{}); err != nil || env.Status != envelope.StatusCompleted {
		t.Fatalf("bob's call beside alice's long ones: %v %+v", err, env)
	}
	if n := running.Load(); n != slots-1 {
		t.Errorf("%d of alice's calls run after bob's, want her %d still running", n, slots-1)
	}
	if m := most.Load(); m > slots-1 {
		t.Errorf("alice held %d of %d slots at once, want all but the reserve", m, slots)
	}
}

// Two principals' long calls together leave the reserve too: once all but
// the reserve are in hand, a principal already holding a slot waits, and
// each principal holding none takes one slot of it. Bob fills all he may,
// erin takes one slot of the reserve and no more, and alice's call starts.
func TestTenant_TwoPrincipalsLongCallsLeaveAThirdASlot(t *testing.T) {
	t.Parallel()
	const slots = 16 // a reserve of two
	client, running, most := longCallsWorker(t, slots)
	alice, bob, erin := client("alice"), client("bob"), client("erin")
	ctx := testCtx(t)
	holding(t, ctx, bob, "t.long", 2*slots)
	waitFor(t, "bob's calls take all but the reserve", func() bool { return running.Load() >= slots-2 })
	holding(t, ctx, erin, "t.long", 2*slots)
	waitFor(t, "erin's first call takes a slot of the reserve", func() bool { return running.Load() >= slots-1 })
	if env, err := alice.Call(ctx, "t.long", HoldInput{}); err != nil || env.Status != envelope.StatusCompleted {
		t.Fatalf("alice's call beside bob's and erin's long ones: %v %+v", err, env)
	}
	if n := running.Load(); n != slots-1 {
		t.Errorf("%d of bob's and erin's calls run after alice's, want %d", n, slots-1)
	}
	if m := most.Load(); m > slots-1 {
		t.Errorf("bob and erin held %d of %d slots at once, want all but the reserve's second slot", m, slots)
	}
}

// longCallsWorker starts a secured deployment and a worker of slots
// serving t.long, which holds until cancelled unless its input says not
// to; it returns a client maker and the calls holding now and at most.
func longCallsWorker(t *testing.T, slots int) (client func(principal string) *executor.Client, running, most *atomic.Int64) {
	t.Helper()
	e, _ := securedTenants(t)
	running, most = new(atomic.Int64), new(atomic.Int64)
	long := executor.Define("t.long", executor.Meta{Description: "Holds until cancelled.", Expose: executor.On(executor.SurfaceDirect),
		SideEffect: executor.SideEffectWrite, Timeout: 10 * time.Minute},
		func(ctx context.Context, c executor.Call[HoldInput]) (string, error) {
			if !c.Input.Hold {
				return "ran", nil
			}
			n := running.Add(1)
			defer running.Add(-1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			<-ctx.Done()
			return "", ctx.Err()
		})
	reg, err := executor.NewRegistry(long)
	if err != nil {
		t.Fatal(err)
	}
	capstantest.Worker(t, reg, capstantest.WithConn(e.ConnectAs(t, auth.WorkerPrincipal)),
		capstantest.WithConfig(executor.WorkerConfig{Pool: "tenant", Lease: 2 * time.Second, Concurrency: slots}))
	client = func(principal string) *executor.Client {
		c, err := executor.NewClient(e.ConnectAs(t, principal), executor.ClientConfig{Actor: envelope.Actor{Kind: envelope.ActorUser, ID: principal}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	return client, running, most
}

// holding submits n calls of capability that hold until cancelled, which
// the test's end cancels, and returns their ids.
func holding(t *testing.T, ctx context.Context, c *executor.Client, capability string, n int) []string {
	t.Helper()
	var ids []string
	t.Cleanup(func() {
		for _, id := range ids {
			_, _ = c.Cancel(context.Background(), id)
		}
	})
	for range n {
		id, err := c.Submit(ctx, capability, HoldInput{Hold: true})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
}
