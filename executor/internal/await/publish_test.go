package await_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor/internal/await"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
)

func TestMain(m *testing.M) {
	testenv.RaiseParallel()
	goleak.VerifyTestMain(m)
}

// testCtx bounds a test's JetStream calls: a safety net, not a timing
// assertion.
func testCtx(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// republished calls on the first time Publish publishes a request again.
type republished struct{ on func() }

func (r republished) Enabled(context.Context, slog.Level) bool { return true }
func (r republished) Handle(_ context.Context, rec slog.Record) error {
	if rec.Message == "request not stored yet; publishing again" {
		r.on()
	}
	return nil
}
func (r republished) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r republished) WithGroup(string) slog.Handler      { return r }

func request(b *broker.Broker, data []byte) *nats.Msg {
	m := nats.NewMsg(b.Names.ExecSubject(broker.Anonymous, "demo.echo"))
	m.Data = data
	m.Header.Set(jetstream.MsgIDHeader, envelope.NewExecutionID())
	return m
}

// A request the connection can never send (larger than the server's maximum
// payload) is refused at once: publishing it again cannot store it, and a
// call without a deadline would never end.
func TestPublish_RequestLargerThanMaxPayloadIsNotPublishedAgain(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	nc := env.Connect(t)
	b, err := broker.Provision(testCtx(t, time.Minute), nc, broker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(testCtx(t, time.Minute))
	defer cancel()
	again := false
	log := slog.New(republished{on: func() { again = true; cancel() }})
	m := request(b, make([]byte, nc.MaxPayload()+1))

	_, err = await.Publish(ctx, nc, m, log)
	if again {
		t.Fatalf("published again after %v: a payload over the server's maximum is retried until the caller's context ends", err)
	}
	if !errors.Is(err, nats.ErrMaxPayload) {
		t.Fatalf("Publish: %v, want nats.ErrMaxPayload", err)
	}
}

// On a replicated exec stream, a request published again while its first
// copy is still being replicated (its acknowledgement did not come within
// PublishTry) is answered "duplicate message id is in process" (409, 10158).
// That answer says the request is on its way to being stored: Publish must
// keep publishing under the id until the stream answers the first copy's
// sequence, not report a failed submit for a request that will run.
func TestPublish_RepeatWhileFirstCopyInProcessIsNotAFailure(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("cluster")
	}
	c := testenv.StartCluster(t, 3)
	ctx := testCtx(t, 2*time.Minute)
	b, err := broker.Provision(ctx, c.Connect(t), broker.Config{Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	info, err := b.Exec.Info(ctx)
	if err != nil || info.Cluster == nil {
		t.Fatalf("exec stream info: %+v, %v", info, err)
	}
	leader := -1
	for i, n := range c.Nodes {
		if n.Server.Name() == info.Cluster.Leader {
			leader = i
		}
	}
	if leader < 0 {
		t.Fatalf("exec stream leader %q is no node", info.Cluster.Leader)
	}
	nc := c.Nodes[leader].Connect(t)
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	// The leader alone cannot commit: the first copy stays in process.
	var followers []int
	for i := range c.Nodes {
		if i != leader {
			c.StopNode(i)
			followers = append(followers, i)
		}
	}
	m := request(b, []byte("{}"))
	if err := nc.PublishMsg(m); err != nil { // the first copy, whose acknowledgement is lost
		t.Fatal(err)
	}

	retried := make(chan struct{})
	log := slog.New(republished{on: func() {
		select {
		case <-retried:
		default:
			close(retried)
		}
	}})
	type result struct {
		ack broker.Ack
		err error
	}
	done := make(chan result, 1)
	go func() {
		ack, err := await.Publish(ctx, nc, m, log)
		done <- result{ack, err}
	}()
	var r result
	select {
	case r = <-done:
	case <-retried:
		for _, i := range followers {
			c.RestartNode(t, i)
		}
		r = <-done
	}
	if r.err != nil {
		t.Fatalf("Publish of a request whose first copy the stream is storing: %v; want its acknowledgement", r.err)
	}
	// Stored once: the repeats were deduplicated.
	if info, err := b.Exec.Info(ctx); err != nil || info.State.Msgs != 1 {
		t.Fatalf("exec stream after Publish: %+v, %v; want one message", info, err)
	}
}

// A call still waiting when its client closes can no longer be answered: the
// subscription is gone and nothing re-reads its envelope. Its wait must end
// then, not when (if ever) the caller's context does.
func TestAwaitFresh_EndsWhenTheWaitersClose(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	nc := env.Connect(t)
	b, err := broker.Provision(testCtx(t, time.Minute), nc, broker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	w, err := await.New(b, broker.Anonymous, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	id := envelope.NewExecutionID()
	ch := w.Add(id)
	// The safety net: a wait that does not end with Close ends here.
	ctx := testCtx(t, 15*time.Second)
	done := make(chan error, 1)
	go func() {
		_, err := w.AwaitFresh(ctx, id, ch, w.Reconnects())
		done <- err
	}()
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err == nil || ctx.Err() != nil {
		t.Fatalf("AwaitFresh after Close returned %v when its context ended (%v): a closed client's waits hang until their caller's context ends", err, ctx.Err())
	}
}
