package auth_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/auth"
	"github.com/capstan-dev/capstan/capstantest"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// Bob and mallory, each within the fair share, hold every slot of a worker
// with long calls: alice's short call must still start (it does not today).
func TestTenant_TwoPrincipalsLongCallsLeaveAThirdASlot(t *testing.T) {
	_, _, alice, bob, mallory, running := threeProducers(t, 8)
	ctx := testCtx(t)
	const slots = 8
	holding(t, ctx, bob, "t.long", 2*slots)
	holding(t, ctx, mallory, "t.long", 2*slots)
	waitFor(t, "bob and mallory fill the worker", func() bool { return running.Load() == slots })
	start := time.Now()
	actx, cancel := context.WithTimeout(ctx, 15*time.Second)
	env, err := alice.Call(actx, "t.long", HoldInput{})
	cancel()
	t.Logf("alice's short call with bob and mallory holding every slot: after %v: %v %+v", time.Since(start), err, env)
	if err != nil || env.Status != envelope.StatusCompleted {
		t.Errorf("alice's call did not complete within 15 s while bob and mallory held all %d slots", slots)
	}
}

func threeProducers(t *testing.T, slots int) (*testenv.Env, *broker.Broker, *executor.Client, *executor.Client, *executor.Client, *atomic.Int64) {
	setup, err := auth.Init(t.TempDir(), "")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"alice", "bob", "mallory"} {
		if err := setup.Add(auth.Grant{Principal: p, Role: auth.RoleProducer, Actors: []string{"user:*"}, Capabilities: []string{"*"}}); err != nil {
			t.Fatal(err)
		}
	}
	e := testenv.Start(t, testenv.Auth(setup))
	ctx := testCtx(t)
	admin, err := broker.Provision(ctx, e.Connect(t), broker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := auth.PublishGrants(ctx, admin.JS, setup, 0); err != nil {
		t.Fatal(err)
	}
	var running atomic.Int64
	long := executor.Define("t.long", executor.Meta{Description: "Holds until cancelled.", Expose: executor.On(executor.SurfaceDirect),
		SideEffect: executor.SideEffectWrite, Timeout: 10 * time.Minute},
		func(ctx context.Context, c executor.Call[HoldInput]) (string, error) {
			if !c.Input.Hold {
				return "ran", nil
			}
			running.Add(1)
			defer running.Add(-1)
			<-ctx.Done()
			return "", ctx.Err()
		})
	reg, err := executor.NewRegistry(long)
	if err != nil {
		t.Fatal(err)
	}
	capstantest.Worker(t, reg, capstantest.WithConn(e.ConnectAs(t, auth.WorkerPrincipal)),
		capstantest.WithConfig(executor.WorkerConfig{Pool: "tenant", Lease: 2 * time.Second, Concurrency: slots}))
	client := func(principal string) *executor.Client {
		c, err := executor.NewClient(e.ConnectAs(t, principal), executor.ClientConfig{Actor: envelope.Actor{Kind: envelope.ActorUser, ID: principal}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	return e, admin, client("alice"), client("bob"), client("mallory"), &running
}
