package console_test

import (
	"context"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/capstantest"
	"github.com/capstan-dev/capstan/console"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/nats-io/nats.go"
)

// The capabilities page shows each capability's limits, with its choice at
// the limit, and their usage now.
func TestCapabilities_LimitsAndTheirUsage(t *testing.T) {
	t.Parallel()
	r := startRig(t, "", console.Config{Open: true})
	nc, err := nats.Connect(r.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	limited := executor.Define("t.limited", executor.Meta{Description: "Limited.", Expose: executor.On(executor.SurfaceDirect),
		SideEffect: executor.SideEffectWrite, Limits: []executor.Limit{
			{Kind: executor.LimitConcurrency, Max: 2},
			{Kind: executor.LimitRate, Per: executor.LimitPerActor, Max: 5, Interval: time.Minute, AtLimit: executor.AtLimitRefuse},
		}}, func(ctx context.Context, call executor.Call[struct{}]) (string, error) { return "ok", nil })
	reg, err := executor.NewRegistry(limited)
	if err != nil {
		t.Fatal(err)
	}
	capstantest.Worker(t, reg, capstantest.WithConn(nc), capstantest.WithConfig(executor.WorkerConfig{Pool: "limited"}))
	if env, err := r.client.Call(testCtx(t), "t.limited", struct{}{}, executor.As(alice)); err != nil || env.Status != envelope.StatusCompleted {
		t.Fatalf("%v %+v", err, env)
	}
	w := signInOpen(t, r.base, "user:ops", "")
	_, _, body := w.get("/capabilities")
	contains(t, "capabilities page", body, `id="cap-t.limited"`, "at most 2 running at once (wait)",
		"5 per 1m per actor (refuse)", "5 per 1m per actor for _anon/user:alice: 1 of 5", "at most 2 running at once: 0 of 2")
}
