package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/capstantest"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
)

// `capstan limits` shows each counter against its limit: a slot held now,
// by which execution and worker, and an actor's rate.
func TestLimits_ShowsUsageAgainstEachLimit(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	held := executor.Define("t.held", executor.Meta{Description: "Holds.", Expose: executor.On(executor.SurfaceDirect),
		SideEffect: executor.SideEffectWrite, Limits: []executor.Limit{
			{Kind: executor.LimitConcurrency, Max: 3},
			{Kind: executor.LimitRate, Per: executor.LimitPerActor, Max: 10, Interval: time.Hour},
		}},
		func(ctx context.Context, call executor.Call[struct{}]) (string, error) {
			started <- struct{}{}
			select {
			case <-release:
			case <-ctx.Done():
			}
			return "done", nil
		})
	reg, err := executor.NewRegistry(held)
	if err != nil {
		t.Fatal(err)
	}
	w := capstantest.Worker(t, reg)
	c := w.Client(t, executor.ClientConfig{Actor: envelope.Actor{Kind: "user", ID: "ann"}})
	id, err := c.Submit(t.Context(), "t.held", struct{}{})
	if err != nil {
		t.Fatal(err)
	}
	<-started
	stdout, stderr, code := capstan(t, w.Conn.ConnectedUrl(), "limits", "-o", "json")
	close(release)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	type usage struct {
		Capability, Kind, Who, Limit string
		Used, Max                    int64
		Holders                      []struct{ Key, Worker string }
	}
	got := decode[[]usage](t, stdout)
	if len(got) != 2 {
		t.Fatalf("%d counters: %s", len(got), stdout)
	}
	slot, rate := got[0], got[1]
	if slot.Kind != "concurrency" || slot.Used != 1 || slot.Max != 3 || len(slot.Holders) != 1 ||
		!strings.HasSuffix(slot.Holders[0].Key, id) || slot.Holders[0].Worker != w.Worker.ID() {
		t.Errorf("the slots: %+v", slot)
	}
	if rate.Kind != "rate" || rate.Who != "_anon/user:ann" || rate.Used != 1 || rate.Max != 10 || rate.Limit != "10 per 1h per actor" {
		t.Errorf("the rate: %+v", rate)
	}
	if env, err := c.Await(t.Context(), id); err != nil || env.Status != envelope.StatusCompleted {
		t.Fatalf("%v %+v", err, env)
	}
	human, _, _ := capstan(t, w.Conn.ConnectedUrl(), "limits", "--capability", "t.")
	if !strings.Contains(human, "at most 3 running at once") || !strings.Contains(human, "_anon/user:ann") {
		t.Errorf("for a person:\n%s", human)
	}
}
