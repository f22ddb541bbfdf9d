package executor_test

import (
	"testing"
	"time"

	"github.com/capstan-dev/capstan/execution"

	"github.com/nats-io/nats.go"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// A request that does not decode, whose execution another delivery holds
// (its message id republished past the duplicate window: the record of the
// other's claim is in the way), is settled only once its execution has its
// envelope (DESIGN §5, §13): the worker leaves it in the stream while the
// claim decides, then, once the envelope is written, terminates it as a
// duplicate. Terminated earlier, nothing would be left to end it if that
// claim's worker were lost.
func TestUndecodableRequest_AnotherClaimInTheWay_SettledOnlyOnceItsEnvelopeExists(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	s := newStore(t, env)
	id := envelope.NewExecutionID()
	s.putRecord(&execution.Record{ExecutionID: id, CapabilityID: "demo.echo", State: execution.StateRunning, Attempt: 1,
		Worker: "busy-worker", Claim: "busy-claim", LeaseUntil: time.Now().UTC().Add(2 * time.Second), StartedAt: time.Now().UTC()})
	startWorker(t, env.Connect(t), executor.WorkerConfig{SweepInterval: -1}, echoCap(nil))
	ctx := ctxT(t)
	if _, err := s.b.JS.PublishMsg(ctx, &nats.Msg{Subject: s.b.Names.ExecSubject(broker.Anonymous, "demo.echo"),
		Data: []byte("\xc1 not msgpack"), Header: nats.Header{"Nats-Msg-Id": []string{broker.Key(broker.Anonymous, id)}}}); err != nil {
		t.Fatal(err)
	}
	st, err := s.b.JS.Stream(ctx, s.b.Names.ExecStream())
	if err != nil {
		t.Fatal(err)
	}
	pool, err := s.b.JS.Consumer(ctx, s.b.Names.ExecStream(), "pool-default")
	if err != nil {
		t.Fatal(err)
	}
	queued := func() uint64 {
		info, err := st.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Msgs
	}
	// Handled once (left with a delay, delivered again) or terminated.
	waitUntil(t, "the request handled", func() bool {
		info, err := pool.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.NumRedelivered > 0 || queued() == 0
	})
	if queued() != 1 {
		t.Fatal("the request was terminated while another claim held its execution, before any envelope")
	}
	s.noEnvelope(id, "an envelope written over another claim")

	// The claim's worker ends it: the request is then a duplicate, settled.
	if _, err := broker.Create(ctx, s.b.Envelopes, broker.Key(broker.Anonymous, id), &envelope.Envelope{V: envelope.Version,
		ExecutionID: id, CapabilityID: "demo.echo", Status: envelope.StatusCompleted, Attempts: 1, FinalizedBy: "busy-worker",
		FinalizedAt: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the request settled once its envelope exists", func() bool { return queued() == 0 })
}
