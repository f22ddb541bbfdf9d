package telemetry_test

import (
	"context"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/capstan-dev/capstan/telemetry"
)

// Each principal's queue is on a scrape, held and bound (DESIGN §12
// "Quotas"), and the calls a client saw refused over a quota are counted by
// quota.
func TestQueues_PerPrincipalDepthBoundAndRefusals(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	b, err := broker.Provision(ctxT(t), env.Connect(t), broker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := broker.ProvisionQueues(ctxT(t), b.JS, b.Names, map[string]broker.QueueLimits{"alice": {Requests: 2, Bytes: -1}}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := b.JS.Publish(ctxT(t), b.Names.ExecSubject("alice", "t.echo"), []byte("waits")); err != nil {
			t.Fatal(err)
		}
	}
	_, err = b.JS.Publish(ctxT(t), b.Names.ExecSubject("alice", "t.echo"), []byte("one too many"))
	full := broker.AsQueueFull(err)
	if full == nil {
		t.Fatalf("alice's third request: %v, want a full queue's refusal", err)
	}
	tel := telemetry.New(telemetry.Options{})
	tel.Watch(b.NC, b.Config.Prefix, time.Nanosecond)
	req := &envelope.Request{ExecutionID: envelope.NewExecutionID(), CapabilityID: "t.echo", SubmittedAt: time.Now()}
	tel.Client().Call(context.Background(), req)(nil, full.QuotaError(2))

	m := scrape(t, tel.Handler())
	for _, want := range []struct {
		name string
		v    float64
	}{{"capstan_queue_requests", 2}, {"capstan_queue_max_requests", 2}, {"capstan_queue_max_bytes", broker.DefaultQueueMaxBytes}} {
		if v, ok := value(m, want.name, "principal=alice"); !ok || v != want.v {
			t.Errorf("%s{principal=alice} = %v (%v), want %v", want.name, v, ok, want.v)
		}
	}
	if v, ok := value(m, "capstan_queue_requests", "principal=_anon"); !ok || v != 0 {
		t.Errorf("the shared queue: %v (%v), want 0", v, ok)
	}
	if v, ok := value(m, "capstan_client_quota_exceeded_total", "quota=queuedRequests"); !ok || v != 1 {
		t.Errorf("refusals counted: %v (%v), want 1", v, ok)
	}
}
