package executor_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/internal/testhooks"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/demo"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// demoCaps returns the demo capabilities whose ids keep says.
func demoCaps(js jetstream.JetStream, keep func(id string) bool) []executor.Capability {
	var out []executor.Capability
	for _, c := range demo.Catalog(js) {
		if keep(c.ID()) {
			out = append(out, c)
		}
	}
	return out
}

func isEmail(id string) bool    { return id == "email.send" }
func isNotEmail(id string) bool { return id != "email.send" }

// runPoolWorker runs a worker until stop is called or the test ends.
func runPoolWorker(t *testing.T, nc *nats.Conn, cfg executor.WorkerConfig, caps []executor.Capability) (stop func()) {
	t.Helper()
	return runWorkerOn(t, nc, cfg, caps...).Stop
}

func TestPools_RequestsOfAPoolWithoutWorkersWaitAndNeverGoToAnotherPool(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	ctx := ctxT(t)
	setup := env.Connect(t)
	js, err := demo.Provision(ctx, setup, 0)
	if err != nil {
		t.Fatal(err)
	}
	stopComms := runPoolWorker(t, env.Connect(t), executor.WorkerConfig{Pool: "comms", Concurrency: 8}, demoCaps(js, isEmail))
	runPoolWorker(t, env.Connect(t), executor.WorkerConfig{Concurrency: 8}, demoCaps(js, isNotEmail))
	c := newClient(t, env.Connect(t))

	// The catalog records each capability's pool.
	for id, pool := range map[string]string{"email.send": "comms", "demo.echo": "default", "orders.refund": "default"} {
		d, _, err := broker.Load[executor.Descriptor](ctx, testhooks.Broker(c).Catalog, id)
		if err != nil || d.Pool != pool {
			t.Fatalf("catalog entry of %s: pool %+v, err %v; want %q", id, d, err, pool)
		}
	}

	stopComms()

	const emails = 10
	var emailIDs []string
	for i := range emails {
		id, err := c.Submit(ctx, "email.send", demo.EmailInput{To: fmt.Sprintf("u%d@example.com", i), Subject: "waits"})
		if err != nil {
			t.Fatal(err)
		}
		emailIDs = append(emailIDs, id)
	}
	var others []executor.Request
	for i := range 10 {
		others = append(others,
			executor.Request{CapabilityID: "demo.echo", Input: map[string]any{"i": i}},
			executor.Request{CapabilityID: "orders.refund", Input: demo.RefundInput{OrderID: fmt.Sprintf("o%d", i), Amount: 10}},
			executor.Request{CapabilityID: "demo.flaky", Input: demo.FlakyInput{FailTimes: 1}})
	}
	envs, errs := c.CallMany(ctx, others)
	for i, e := range envs {
		if errs[i] != nil || e.Status != envelope.StatusCompleted {
			t.Fatalf("%s with the comms pool down: %+v, err %v", others[i].CapabilityID, e, errs[i])
		}
	}

	// Everything else is done, and no email was touched: no record, no
	// envelope, every request still in the comms pool's consumer.
	for _, id := range emailIDs {
		if st, err := c.Status(ctx, id); !errors.Is(err, executor.ErrNoSuchExecution) {
			t.Fatalf("email %s was touched with its pool down: %+v, err %v", id, st, err)
		}
	}
	cons, err := testhooks.Broker(c).Exec.Consumer(ctx, "pool-comms")
	if err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if waiting := info.NumPending + uint64(info.NumAckPending); waiting != emails {
		t.Fatalf("pool-comms holds %d requests, want the %d emails", waiting, emails)
	}
	if !slices.Equal(info.Config.FilterSubjects, []string{"capstan.exec.*.email.send"}) {
		t.Fatalf("pool-comms filters %v", info.Config.FilterSubjects)
	}

	// A default-pool worker cannot take email.send over while comms owns it.
	reg, err := executor.NewRegistry(demoCaps(js, func(string) bool { return true })...)
	if err != nil {
		t.Fatal(err)
	}
	thief, err := executor.NewWorker(env.Connect(t), reg, executor.WorkerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if err := thief.Run(ctx); !errors.Is(err, broker.ErrConfigConflict) {
		t.Fatalf("a default-pool worker serving email.send: %v, want ErrConfigConflict", err)
	}

	// The comms pool comes back: its requests complete, one email each.
	runPoolWorker(t, env.Connect(t), executor.WorkerConfig{Pool: "comms", Concurrency: 8}, demoCaps(js, isEmail))
	for _, id := range emailIDs {
		e, err := c.Await(ctx, id)
		if err != nil || e.Status != envelope.StatusCompleted {
			t.Fatalf("email %s after its pool came back: %+v, err %v", id, e, err)
		}
	}
	sent, _ := outboxByExecution(t, ctx, js)
	for _, id := range emailIDs {
		if sent[id] != 1 {
			t.Fatalf("email %s sent %d times, want 1", id, sent[id])
		}
	}
}

func TestPools_FanOutAcrossPoolsCompletesWithOneEnvelopeEach(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	ctx := ctxT(t)
	js, err := demo.Provision(ctx, env.Connect(t), 0)
	if err != nil {
		t.Fatal(err)
	}
	runPoolWorker(t, env.Connect(t), executor.WorkerConfig{Pool: "comms", Concurrency: 16}, demoCaps(js, isEmail))
	runPoolWorker(t, env.Connect(t), executor.WorkerConfig{Pool: "payments", Concurrency: 16},
		demoCaps(js, func(id string) bool { return id == "orders.refund" }))
	runPoolWorker(t, env.Connect(t), executor.WorkerConfig{Concurrency: 16},
		demoCaps(js, func(id string) bool { return id != "email.send" && id != "orders.refund" }))
	c := newClient(t, env.Connect(t))

	var reqs []executor.Request
	for i := range 100 {
		reqs = append(reqs,
			executor.Request{CapabilityID: "email.send", Input: demo.EmailInput{To: fmt.Sprintf("u%d@example.com", i), Subject: "fan-out"}},
			executor.Request{CapabilityID: "orders.refund", Input: demo.RefundInput{OrderID: fmt.Sprintf("o%d", i), Amount: 10}},
			executor.Request{CapabilityID: "demo.echo", Input: map[string]any{"i": i}})
	}
	envs, errs := c.CallMany(ctx, reqs)
	seen := map[string]bool{}
	for i, e := range envs {
		if errs[i] != nil || e == nil || e.Status != envelope.StatusCompleted || e.CapabilityID != reqs[i].CapabilityID {
			t.Fatalf("call %d (%s): %+v, err %v", i, reqs[i].CapabilityID, e, errs[i])
		}
		if seen[e.ExecutionID] {
			t.Fatalf("execution %s answered twice", e.ExecutionID)
		}
		seen[e.ExecutionID] = true
	}
	// One envelope per call, and each pool's consumer is drained.
	st, err := testhooks.Broker(c).JS.Stream(ctx, "KV_"+testhooks.Broker(c).Names.EnvelopesBucket())
	if err != nil {
		t.Fatal(err)
	}
	if got := st.CachedInfo().State.Msgs; got != uint64(len(reqs)) {
		t.Fatalf("%d envelopes stored for %d calls", got, len(reqs))
	}
	for _, pool := range []string{"comms", "payments", "default"} {
		waitDrained(t, ctx, testhooks.Broker(c), "pool-"+pool)
	}
}

// waitDrained waits until the consumer has nothing pending or unacknowledged.
func waitDrained(t *testing.T, ctx context.Context, b *broker.Broker, name string) {
	t.Helper()
	for {
		cons, err := b.Exec.Consumer(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		info, err := cons.Info(ctx)
		if err == nil && info.NumPending == 0 && info.NumAckPending == 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("consumer %s not drained: %+v, err %v", name, info, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
