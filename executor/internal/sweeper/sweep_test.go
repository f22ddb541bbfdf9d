package sweeper

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor/internal/engine"
	"github.com/capstan-dev/capstan/internal/auditemit"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/capstan-dev/capstan/observe"
	"github.com/nats-io/nats.go/jetstream"
)

// A request past its start deadline that a consumer delivered, and whose
// record is gone (it outlived the record window), may have run under that
// record: the sweeper ends it OUTCOME_UNKNOWN, never NOT_STARTED. Only a
// request no consumer ever delivered proves, by its missing record, that
// it never ran.
func TestSweep_DeliveredRequestWithoutRecord_NeverNotStarted(t *testing.T) {
	t.Parallel()
	b, eng := rig(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cons, err := b.EnsurePool(ctx, broker.PoolConfig{Pool: "p", Capabilities: []string{"test.op"}, AckWait: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	delivered, never := publish(t, b, "delivered"), publish(t, b, "never")
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for range batch.Messages() { // a worker took it, and was lost before any record
	}
	// The sweeper reads the queue after the record window: a record
	// written then would have expired by now.
	later := time.Now().Add(2*b.Config.RecordWindow + time.Minute)
	s := New(b, eng, Config{Worker: "sweeper", Now: func() time.Time { return later }})
	if _, err := s.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	if got := envelopeOf(t, b, delivered); got == nil || got.Error == nil || got.Error.Code != envelope.CodeOutcomeUnknown {
		t.Fatalf("the delivered request: envelope %+v, want OUTCOME_UNKNOWN", got)
	}
	if got := envelopeOf(t, b, never); got == nil || got.Error == nil || got.Error.Code != envelope.CodeNotStarted {
		t.Fatalf("the request never delivered: envelope %+v, want NOT_STARTED", got)
	}
}

// publish queues a request for test.op whose start deadline has passed,
// and returns its execution id.
func publish(t *testing.T, b *broker.Broker, note string) string {
	t.Helper()
	past := time.Now().Add(-time.Second)
	req := &envelope.Request{V: envelope.Version, ExecutionID: envelope.NewExecutionID(), CapabilityID: "test.op",
		Actor: envelope.Actor{Kind: "user", ID: note}, SubmittedAt: time.Now().UTC(), StartBy: &past}
	data, err := envelope.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := b.JS.Publish(ctx, b.Names.ExecSubject(broker.Anonymous, "test.op"), data,
		jetstream.WithMsgID(broker.Key(broker.Anonymous, req.ExecutionID))); err != nil {
		t.Fatal(err)
	}
	return req.ExecutionID
}

func envelopeOf(t *testing.T, b *broker.Broker, id string) *envelope.Envelope {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	env, _, err := broker.Load[envelope.Envelope](ctx, b.Envelopes, broker.Key(broker.Anonymous, id))
	if err != nil {
		return nil
	}
	return env
}

// rig provisions a deployment on a new embedded server and returns it with
// the engine of a worker on it, which sweepers end requests through.
func rig(tb testing.TB) (*broker.Broker, *engine.Runner) {
	tb.Helper()
	env := testenv.Start(tb)
	nc := env.Connect(tb)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := broker.Provision(ctx, nc, broker.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		tb.Fatal(err)
	}
	eng := engine.NewRunner(nc, slog.New(slog.DiscardHandler), engine.Config{ID: "sweeper", Lease: 30 * time.Second,
		Observer: observe.NopWorker{}})
	eng.Provisioned(b, auditemit.New(b.NC, auditemit.Options{Prefix: b.Names.Prefix(), Audit: b.Audit, Index: b.Index, Logger: slog.New(slog.DiscardHandler)}))
	tb.Cleanup(eng.Stop)
	return b, eng
}
