package executor_test

import (
	"context"
	"errors"
	"testing"

	"github.com/capstan-dev/capstan/execution"
	"github.com/capstan-dev/capstan/internal/testhooks"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// An id that can never name an execution is refused at once, as Status and
// Cancel refuse it: awaiting it would wait for the whole context for an
// envelope that cannot exist.
func TestAwait_InvalidExecutionIDRefusedAtOnce(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	c := newClient(t, env.Connect(t))
	ctx := ctxT(t)
	for _, id := range []string{"", "a.b", "a.*", ">", "bad id"} {
		got, err := c.Await(ctx, id)
		if err == nil || got != nil {
			t.Fatalf("Await(%q) = %v, %v; want an error", id, got, err)
		}
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
			t.Fatalf("Await(%q) waited for the context: %v", id, err)
		}
	}
}

// A closed client submits nothing: a call, a submit or a resume after Close
// ends with ErrClosed, and no request reaches the exec stream.
func TestClosedClient_SubmitsNothing(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	nc := env.Connect(t)
	c := newClient(t, nc)
	ctx := ctxT(t)
	st, err := testhooks.Broker(c).JS.Stream(ctx, "CAPSTAN_EXEC")
	if err != nil {
		t.Fatal(err)
	}
	before, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Call(ctx, "demo.echo", map[string]any{"a": 1}); !errors.Is(err, executor.ErrClosed) {
		t.Errorf("Call after Close: %v, want ErrClosed", err)
	}
	if _, err := c.Submit(ctx, "demo.echo", map[string]any{"a": 1}); !errors.Is(err, executor.ErrClosed) {
		t.Errorf("Submit after Close: %v, want ErrClosed", err)
	}
	if _, err := c.SubmitResume(ctx, envelope.NewExecutionID()); !errors.Is(err, executor.ErrClosed) {
		t.Errorf("SubmitResume after Close: %v, want ErrClosed", err)
	}
	envs, errs := c.CallMany(ctx, []executor.Request{{CapabilityID: "demo.echo"}, {CapabilityID: "demo.echo"}})
	for i := range envs {
		if envs[i] != nil || !errors.Is(errs[i], executor.ErrClosed) {
			t.Errorf("CallMany[%d] after Close: %v, %v, want ErrClosed", i, envs[i], errs[i])
		}
	}
	after, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after.State.LastSeq != before.State.LastSeq {
		t.Fatalf("the exec stream moved from %d to %d: a closed client published", before.State.LastSeq, after.State.LastSeq)
	}
}

// A stored envelope or record of a schema version this client does not know
// is refused as not decoding (docs/wire.md), by Await and Status alike, at
// once: envelopes are written once, and waiting would never see another.
func TestAwaitAndStatus_UnknownVersionRefused(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	c := newClient(t, env.Connect(t))
	ctx := ctxT(t)
	id := envelope.NewExecutionID()
	b, err := envelope.Marshal(&envelope.Envelope{V: envelope.Version + 1, ExecutionID: id, CapabilityID: "demo.echo",
		Status: envelope.StatusCompleted, Attempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := testhooks.Broker(c).Envelopes.Put(ctx, "_anon."+id, b); err != nil {
		t.Fatal(err)
	}
	if got, err := c.Await(ctx, id); !errors.Is(err, envelope.ErrDecode) {
		t.Errorf("Await = %v, %v; want ErrDecode", got, err)
	}
	if got, err := c.Status(ctx, id); !errors.Is(err, envelope.ErrDecode) {
		t.Errorf("Status = %v, %v; want ErrDecode", got, err)
	}
	rid := envelope.NewExecutionID()
	rb, err := envelope.Marshal(&execution.Record{V: envelope.Version + 1, ExecutionID: rid, State: execution.StateRunning})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := testhooks.Broker(c).Executions.Put(ctx, "_anon."+rid, rb); err != nil {
		t.Fatal(err)
	}
	if got, err := c.Status(ctx, rid); !errors.Is(err, envelope.ErrDecode) {
		t.Errorf("Status of a record = %v, %v; want ErrDecode", got, err)
	}
}
