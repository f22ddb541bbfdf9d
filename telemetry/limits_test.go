package telemetry_test

import (
	"context"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/capstan-dev/capstan/telemetry"
)

// Limits in the scrape (DESIGN §17): each execution a limit held back, by
// the limit's kind and what it did, and the slots held, back to none once
// every execution ended.
func TestMetrics_LimitedAndSlotsHeld(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	nc := env.Connect(t)
	ctx := ctxT(t)
	tel := telemetry.New(telemetry.Options{})
	if _, err := broker.Provision(ctx, nc, broker.Config{}); err != nil {
		t.Fatal(err)
	}
	once := executor.Define("t.once", executor.Meta{Description: "Once an hour.", Expose: executor.On(executor.SurfaceDirect),
		SideEffect: executor.SideEffectWrite, Limits: []executor.Limit{
			{Kind: executor.LimitConcurrency, Max: 4},
			{Kind: executor.LimitRate, Max: 1, Interval: time.Hour, AtLimit: executor.AtLimitRefuse},
		}}, func(ctx context.Context, call executor.Call[struct{}]) (string, error) { return "ok", nil })
	stop := runWorker(t, nc, executor.WorkerConfig{Pool: "obs", Observer: tel.Worker()}, once)
	c := newClient(t, nc, executor.ClientConfig{})
	for i, want := range []envelope.Status{envelope.StatusCompleted, envelope.StatusFailed} {
		if env, err := c.Call(ctx, "t.once", struct{}{}); err != nil || env.Status != want {
			t.Fatalf("call %d: %v %+v", i, err, env)
		}
	}
	stop()
	m := scrape(t, tel.Handler())
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"capstan_limited_total", []string{"capability=t.once", "pool=obs", "kind=rate", "action=refuse"}, 1},
		{"capstan_limit_slots_held", []string{"capability=t.once", "pool=obs"}, 0},
		{"capstan_executions_finalized_total", []string{"capability=t.once", "pool=obs", "status=failed", "code=RATE_LIMITED"}, 1},
	} {
		if got, ok := value(m, c.name, c.labels...); !ok || got != c.want {
			t.Errorf("%s%v = %v (found %v), want %v", c.name, c.labels, got, ok, c.want)
		}
	}
}
