package demo

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/capstantest"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/testenv"
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

// A second run of the same attempt of email.send — what the runtime must never
// do — is invisible in the outbox, whose message id names the attempt, and
// shows in the calls stream, which keeps every handler call.
func TestDemo_SecondRunOfOneAttempt_ShowsInTheCallsStream(t *testing.T) {
	t.Parallel()
	ctx, js := provisioned(t)
	send := recorded(js, sendEmail(js))
	call := executor.Call[EmailInput]{Input: EmailInput{To: "ada@example.com", Subject: "twice"},
		ExecutionID: envelope.NewExecutionID(), CapabilityID: "email.send", Attempt: 1}
	for range 2 {
		if _, err := send(ctx, call); err != nil {
			t.Fatal(err)
		}
	}
	if n := streamMsgs(t, ctx, js, OutboxStream); n != 1 {
		t.Fatalf("the outbox holds %d emails of one attempt, want 1 (its per-attempt view)", n)
	}
	calls, err := ReadCalls(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	want := HandlerCall{CapabilityID: "email.send", ExecutionID: call.ExecutionID, Attempt: 1}
	if len(calls) != 2 || calls[0] != want || calls[1] != want {
		t.Fatalf("calls stream %+v, want two of %+v", calls, want)
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
		{CapabilityID: "demo.flaky", ExecutionID: flaky.ExecutionID, Attempt: 1},
		{CapabilityID: "demo.flaky", ExecutionID: flaky.ExecutionID, Attempt: 2},
	}
	if len(calls) != len(want) || calls[0] != want[0] || calls[1] != want[1] {
		t.Fatalf("calls %+v, want %+v", calls, want)
	}
}
