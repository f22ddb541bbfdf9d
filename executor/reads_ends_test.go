package executor_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/capstan-dev/capstan/internal/testhooks"
)

// A read that a stage refuses ends, without running and without a record:
// an input that does not validate, a policy's denial. One a policy sends to
// an approval is claimed from there on, as any call: its record holds the
// approval, and its handler runs only once the approval is granted, at the
// resume.
func TestReads_RefusedOrSentToApproval_EndAndNeverRunBeforeIt(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	nc := env.Connect(t)
	var calls atomic.Int64
	asks := executor.Policy{Name: "asks", MayRequireApproval: true,
		Evaluate: func(_ context.Context, r executor.PolicyRequest) (executor.Decision, error) {
			switch r.Input.(*echoIn).Hello {
			case "deny":
				return executor.Decision{Stance: executor.StanceDeny, Reason: "no"}, nil
			case "ask":
				return executor.Decision{Stance: executor.StanceRequireApproval, Reason: "look first"}, nil
			}
			return executor.Decision{}, nil
		}}
	startWorker(t, nc, executor.WorkerConfig{},
		executor.Define("t.read", executor.Meta{Description: "Reads.", Expose: executor.On(executor.SurfaceDirect),
			SideEffect: executor.SideEffectRead, Idempotent: true, Policies: []executor.Policy{asks}},
			func(ctx context.Context, c executor.Call[echoIn]) (echoIn, error) { calls.Add(1); return c.Input, nil }))
	c := newClient(t, nc)
	b := testhooks.Broker(c)

	for _, tc := range []struct {
		input any
		code  envelope.Code
	}{
		{map[string]any{"hello": 5}, envelope.CodeInputInvalid},
		{echoIn{Hello: "deny"}, envelope.CodePolicyDenied},
	} {
		got, err := c.Call(ctxT(t), "t.read", tc.input, executor.As(alice))
		if err != nil {
			t.Fatal(err)
		}
		mustFailWith(t, got, tc.code)
		if rec := recordOf(t, b, got.ExecutionID); rec != nil {
			t.Errorf("%s: a refused read has a record: %s", tc.code, rec)
		}
	}

	got, ap := requireApproval(t, c, "t.read", echoIn{Hello: "ask"}, executor.As(alice))
	if calls.Load() != 0 {
		t.Fatalf("%d handler calls before any approval", calls.Load())
	}
	if recordOf(t, b, got.ExecutionID) == nil {
		t.Error("a read waiting for its approval has no record")
	}
	if _, err := c.Decide(ctxT(t), ap.ID, approvals.Verdict{Approve: true, Approver: bobApprover}); err != nil {
		t.Fatal(err)
	}
	resumed, err := c.Resume(ctxT(t), ap.ID)
	if err != nil || resumed.Status != envelope.StatusCompleted {
		t.Fatalf("resume %+v %v", resumed, err)
	}
	if calls.Load() != 1 {
		t.Errorf("%d handler calls after the approval, want 1", calls.Load())
	}
	if rec := recordOf(t, b, resumed.ExecutionID); rec == nil {
		t.Error("the resumed read ran without its claim")
	}
}

// A read lost with its worker and delivered again only after its start
// deadline is not run again: it ends NOT_STARTED, as docs/guarantees.md
// says of a read that started and had not ended by its deadline; its trail
// still shows the start that was lost.
func TestReads_LostThenPastItsStartDeadline_EndsNotStarted(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	var lostCalls, calls atomic.Int64
	started, never := make(chan struct{}, 1), make(chan struct{})
	lostConn := env.Connect(t)
	lease := time.Second
	lost := runWorkerOn(t, lostConn, executor.WorkerConfig{Lease: lease, Grace: time.Millisecond},
		gatedRead("t.read", &lostCalls, started, never))
	c := newClient(t, env.Connect(t))
	id, err := c.Submit(ctxT(t), "t.read", echoIn{Hello: "late"}, executor.As(alice), executor.StartWithin(lease))
	if err != nil {
		t.Fatal(err)
	}
	<-started
	waitUntil(t, "the first run's start is on the trail", func() bool {
		evs, err := c.Trail(ctxT(t), id)
		return err == nil && len(ofType(evs, audit.EventStarted)) == 1
	})
	lostConn.Close()
	time.Sleep(2 * lease) // past the start deadline before another worker is there
	released := make(chan struct{})
	close(released)
	startWorker(t, env.Connect(t), executor.WorkerConfig{Lease: lease}, gatedRead("t.read", &calls, make(chan struct{}, 1), released))
	got, err := c.Await(ctxT(t), id)
	if err != nil {
		t.Fatal(err)
	}
	mustFailWith(t, got, envelope.CodeNotStarted)
	if calls.Load() != 0 {
		t.Errorf("run again past its start deadline: %d calls", calls.Load())
	}
	lost.Stop()
	flushAudit(t)
	if evs := trail(t, c, id); len(ofType(evs, audit.EventStarted)) != 1 {
		t.Errorf("trail %v: want the lost start kept", typesOf(evs))
	}
}
