package demo

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/capstantest"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/nats-io/nats.go/jetstream"
)

// testCtx ends a little before the test's own deadline.
func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx := context.Background()
	if d, ok := t.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, d.Add(-5*time.Second))
		t.Cleanup(cancel)
	}
	return ctx
}

func provisioned(t *testing.T) (context.Context, jetstream.JetStream) {
	t.Helper()
	ctx := testCtx(t)
	js, err := Provision(ctx, testenv.Start(t).Connect(t), 1)
	if err != nil {
		t.Fatal(err)
	}
	return ctx, js
}

func streamMsgs(t *testing.T, ctx context.Context, js jetstream.JetStream, name string) uint64 {
	t.Helper()
	s, err := js.Stream(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	return s.CachedInfo().State.Msgs
}

// A second call of email.send for one execution — what the runtime never
// makes on a guess — shows in the calls stream, which keeps every handler
// call, and sends nothing: the outbox holds one email per idempotency key,
// which the second call finds and reports.
func TestDemo_SecondCallOfOneExecution_ShowsInTheCallsStreamOneEmail(t *testing.T) {
	t.Parallel()
	ctx, js := provisioned(t)
	send := recorded(js, sendEmail(js))
	id := envelope.NewExecutionID()
	var outs []EmailOutput
	for attempt := 1; attempt <= 2; attempt++ {
		call := executor.Call[EmailInput]{Input: EmailInput{To: "ada@example.com", Subject: "twice"},
			ExecutionID: id, IdempotencyKey: envelope.IdempotencyKey(broker.Anonymous, id), CapabilityID: "email.send", Attempt: attempt}
		out, err := send(ctx, call)
		if err != nil {
			t.Fatal(err)
		}
		outs = append(outs, out)
	}
	if n := streamMsgs(t, ctx, js, OutboxStream); n != 1 || outs[0] != outs[1] {
		t.Fatalf("the outbox holds %d emails of one key, the calls reported %+v; want one email, reported twice", n, outs)
	}
	calls, err := ReadCalls(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	if len(calls) != 2 || calls[0].ExecutionID != id || calls[1].Attempt != 2 {
		t.Fatalf("calls stream %+v, want both calls", calls)
	}
	sent, found, err := sentEmail(ctx, js, envelope.IdempotencyKey(broker.Anonymous, id))
	if err != nil || !found || sent.Header.Get(AttemptHeader) != "1" || sent.Header.Get(ExecutionIDHeader) != id {
		t.Fatalf("outbox email %+v, found %v, err %v: want attempt 1's", sent, found, err)
	}
}

// email.send's reconciler reads the outbox by idempotency key: the email of
// the execution is found, with the sequence the handler reports; no email is
// a proof of absence; another execution's email under the key is no
// evidence either way.
func TestDemo_EmailReconciler(t *testing.T) {
	t.Parallel()
	ctx, js := provisioned(t)
	r := EmailRecovery(js)
	if !r.ProvesAbsence {
		t.Fatal("email.send's reconciler does not prove absence")
	}
	id := envelope.NewExecutionID()
	q := executor.Reconciliation[EmailInput]{ExecutionID: id, IdempotencyKey: envelope.IdempotencyKey(broker.Anonymous, id), Attempt: 1}
	if got, err := r.Reconcile(ctx, q); err != nil || got.Effect != executor.EffectAbsent {
		t.Fatalf("before the email: %+v, %v; want absent", got, err)
	}
	out, err := sendEmail(js)(ctx, executor.Call[EmailInput]{Input: EmailInput{To: "ada@example.com"}, ExecutionID: id,
		IdempotencyKey: q.IdempotencyKey, CapabilityID: "email.send", Attempt: 1})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := r.Reconcile(ctx, q); err != nil || got.Effect != executor.EffectFound || got.Output != out {
		t.Fatalf("after the email: %+v, %v; want found %+v", got, err, out)
	}
	other := q
	other.ExecutionID = envelope.NewExecutionID()
	if got, err := r.Reconcile(ctx, other); err != nil || got.Effect != executor.EffectUnknown {
		t.Fatalf("another execution's email under the key: %+v, %v; want unknown", got, err)
	}
}

// orders.refund's reconciler reads the refunds bucket by idempotency key.
func TestDemo_RefundReconciler(t *testing.T) {
	t.Parallel()
	ctx, js := provisioned(t)
	r := refundRecovery(js)
	id := envelope.NewExecutionID()
	in := RefundInput{OrderID: "o-1", Amount: 40}
	q := executor.Reconciliation[RefundInput]{Input: in, ExecutionID: id, IdempotencyKey: envelope.IdempotencyKey(broker.Anonymous, id), Attempt: 1}
	if got, err := r.Reconcile(ctx, q); err != nil || got.Effect != executor.EffectAbsent {
		t.Fatalf("before the refund: %+v, %v; want absent", got, err)
	}
	kv, err := js.KeyValue(ctx, RefundsBucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Create(ctx, q.IdempotencyKey, envelope.MustRaw(in)); err != nil {
		t.Fatal(err)
	}
	if got, err := r.Reconcile(ctx, q); err != nil || got.Effect != executor.EffectFound || got.Output.OrderID != "o-1" {
		t.Fatalf("after the refund: %+v, %v; want found", got, err)
	}
	q.Input.Amount = 41
	if got, err := r.Reconcile(ctx, q); err != nil || got.Effect != executor.EffectUnknown {
		t.Fatalf("another refund under the key: %+v, %v; want unknown", got, err)
	}
}

// An outbox an earlier version made (one subject for every email) is widened
// to the subjects by idempotency key, its emails kept.
func TestDemo_ProvisionWidensAnEarlierOutbox(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	nc := testenv.Start(t).Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: OutboxStream, Subjects: []string{OutboxSubject}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, OutboxSubject, []byte("old")); err != nil {
		t.Fatal(err)
	}
	if _, err := Provision(ctx, nc, 1); err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, OutboxStream)
	if err != nil {
		t.Fatal(err)
	}
	if cfg := s.CachedInfo().Config; len(cfg.Subjects) != 2 || s.CachedInfo().State.Msgs != 1 {
		t.Fatalf("outbox subjects %v with %d emails", cfg.Subjects, s.CachedInfo().State.Msgs)
	}
}

// A handler's call is recorded before its effect: a call that fails to reach
// the calls stream has no effect, and one that was recorded but never got to
// its effect still counts.
func TestDemo_CallRecordedBeforeTheEffect(t *testing.T) {
	t.Parallel()
	ctx, js := provisioned(t)
	if err := js.DeleteStream(ctx, CallsStream); err != nil {
		t.Fatal(err)
	}
	send := recorded(js, sendEmail(js))
	call := executor.Call[EmailInput]{Input: EmailInput{To: "ada@example.com", Subject: "unrecorded"},
		ExecutionID: envelope.NewExecutionID(), CapabilityID: "email.send", Attempt: 1}
	// Without its stream the record is tried again until the context ends;
	// the second bounds the test, not what it checks.
	short, cancelShort := context.WithTimeout(ctx, time.Second)
	_, err := send(short, call)
	cancelShort()
	if err == nil {
		t.Fatal("email.send ran without its calls stream")
	}
	if n := streamMsgs(t, ctx, js, OutboxStream); n != 0 {
		t.Fatalf("an unrecorded call sent %d emails", n)
	}

	if _, err := Provision(ctx, js.Conn(), 1); err != nil {
		t.Fatal(err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	never := recorded(js, func(ctx context.Context, c executor.Call[EmailInput]) (EmailOutput, error) {
		cancel() // the worker is lost between the record and the effect
		return EmailOutput{}, context.Cause(ctx)
	})
	if _, err := never(cancelled, call); !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v", err)
	}
	if calls, err := ReadCalls(ctx, js); err != nil || len(calls) != 1 {
		t.Fatalf("calls %+v, err %v; want the one call recorded", calls, err)
	}
}

// Through a worker, every demo handler but demo.echo records each call with
// its attempt: demo.flaky failing once shows attempts 1 and 2.
func TestDemo_WorkerCallsRecordedPerAttempt(t *testing.T) {
	t.Parallel()
	ctx, js := provisioned(t)
	reg, err := executor.NewRegistry(Catalog(js)...)
	if err != nil {
		t.Fatal(err)
	}
	w := capstantest.Worker(t, reg, capstantest.WithConn(js.Conn()))
	c := w.Client(t, executor.ClientConfig{Actor: envelope.Actor{Kind: "user", ID: "test"}})

	echo, err := c.Call(ctx, "demo.echo", map[string]any{"a": 1})
	if err != nil || echo.Status != envelope.StatusCompleted {
		t.Fatalf("echo: %+v, %v", echo, err)
	}
	flaky, err := c.Call(ctx, "demo.flaky", FlakyInput{FailTimes: 1})
	if err != nil || flaky.Status != envelope.StatusCompleted || flaky.Attempts != 2 {
		t.Fatalf("flaky: %+v, %v", flaky, err)
	}
	calls, err := ReadCalls(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	want := []HandlerCall{
		{CapabilityID: "demo.flaky", Principal: broker.Anonymous, ExecutionID: flaky.ExecutionID, Attempt: 1},
		{CapabilityID: "demo.flaky", Principal: broker.Anonymous, ExecutionID: flaky.ExecutionID, Attempt: 2},
	}
	if len(calls) != len(want) || calls[0] != want[0] || calls[1] != want[1] {
		t.Fatalf("calls %+v, want %+v", calls, want)
	}
}

// A cancel before email.send sends (its delay) ends it CANCELLED with no
// email; a cancel after (its hold, the receipt recorded) comes after the
// effect: the execution completes from its receipt, and says so.
func TestDemo_EmailCancelledBeforeOrAfterItsSend(t *testing.T) {
	t.Parallel()
	ctx, js := provisioned(t)
	reg, err := executor.NewRegistry(Catalog(js)...)
	if err != nil {
		t.Fatal(err)
	}
	w := capstantest.Worker(t, reg, capstantest.WithConn(js.Conn()))
	c := w.Client(t, executor.ClientConfig{Actor: envelope.Actor{Kind: "user", ID: "test"}})
	cancelWhenCalled := func(in EmailInput) *envelope.Envelope {
		t.Helper()
		before := streamMsgs(t, ctx, js, CallsStream)
		id, err := c.Submit(ctx, "email.send", in)
		if err != nil {
			t.Fatal(err)
		}
		for streamMsgs(t, ctx, js, CallsStream) == before {
			time.Sleep(10 * time.Millisecond)
		}
		if in.HoldMs > 0 {
			// Cancel once the receipt is on the record.
			for {
				s, err := c.Status(ctx, id)
				if err != nil {
					t.Fatal(err)
				}
				if s.Record != nil && len(s.Record.Receipt) > 0 {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
		if _, err := c.Cancel(ctx, id); err != nil {
			t.Fatal(err)
		}
		env, err := c.Await(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return env
	}
	env := cancelWhenCalled(EmailInput{To: "ada@example.com", DelayMs: 60_000})
	if env.Status != envelope.StatusCancelled || env.Recovered != nil || streamMsgs(t, ctx, js, OutboxStream) != 0 {
		t.Fatalf("cancelled in its delay: %s %+v, %d emails; want cancelled, none sent", env.Status, env.Recovered,
			streamMsgs(t, ctx, js, OutboxStream))
	}
	env = cancelWhenCalled(EmailInput{To: "ada@example.com", HoldMs: 60_000})
	var out EmailOutput
	if err := env.Output.Decode(&out); err != nil || env.Status != envelope.StatusCompleted || env.Recovered == nil ||
		env.Recovered.How != envelope.RecoveredByReceipt || out.OutboxSeq != 1 {
		t.Fatalf("cancelled in its hold: %s %+v output %+v (%v); want completed from its receipt, email 1", env.Status,
			env.Recovered, out, err)
	}
}
