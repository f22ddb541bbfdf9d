package executor_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/execution"
	"github.com/capstan-dev/capstan/internal/testhooks"

	"github.com/nats-io/nats.go"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/demo"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// runWorker is startWorker with a stop the test may call before it ends; it
// returns once the worker also answers control requests.
func runWorker(t *testing.T, nc *nats.Conn, cfg executor.WorkerConfig, caps ...executor.Capability) (*executor.Worker, func()) {
	t.Helper()
	w := runWorkerOn(t, nc, cfg, caps...)
	// Control requests are served once the worker pulls from its pool.
	c := newClient(t, nc)
	waitUntil(t, "the worker answers describe", func() bool {
		_, err := c.Describe(ctxT(t), "", alice, executor.Scope{})
		if err != nil && !errors.Is(err, executor.ErrNoWorkers) {
			t.Fatal(err)
		}
		return err == nil
	})
	return w.Worker, w.Stop
}

// waitState waits until the execution's record is in state.
func waitState(t *testing.T, c *executor.Client, id string, state execution.State) {
	t.Helper()
	ctx := ctxT(t)
	for {
		s, err := c.Status(ctx, id)
		if err == nil && s.Record != nil && s.Record.State == state {
			return
		}
		if err != nil && !errors.Is(err, executor.ErrNoSuchExecution) {
			t.Fatal(err)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("execution %s never reached %s", id, state)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func wantCancelled(t *testing.T, got *envelope.Envelope, attempts int) {
	t.Helper()
	if got.Status != envelope.StatusCancelled || got.Error == nil || got.Error.Code != envelope.CodeCancelled ||
		got.Error.Retryable || got.Error.Stage != envelope.StageCancelation || got.Attempts != attempts {
		t.Fatalf("status %s, attempts %d, error %+v; want cancelled/CANCELLED after %d attempt(s)", got.Status, got.Attempts, got.Error, attempts)
	}
}

// TestCancel_DuringAnAttemptIsTerminal: a read with a retry configured, yet
// a cancelled attempt is never re-attempted. Its timeout outlasts the test,
// so that only the cancel can end the attempt, however slow the machine.
func TestCancel_DuringAnAttemptIsTerminal(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	var calls atomic.Int64
	w := startWorker(t, env.Connect(t), executor.WorkerConfig{}, blocking("report.build",
		executor.Meta{SideEffect: executor.SideEffectRead, Timeout: 10 * time.Minute, Retry: &executor.Retry{MaxAttempts: 1}}, &calls))
	c := newClient(t, env.Connect(t))
	ctx := ctxT(t)

	id, err := c.Submit(ctx, "report.build", nil, executor.As(alice))
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, c, id, execution.StateRunning)
	reply, err := c.Cancel(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	// The running worker may have finalized it before the cancel's reply.
	if reply.ExecutionID != id || reply.Finalized && reply.Status != envelope.StatusCancelled {
		t.Errorf("cancel reply %+v", reply)
	}
	got, err := c.Await(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	wantCancelled(t, got, 1)
	if n := w.Stats().HandlerCalls; n != 1 {
		t.Errorf("%d handler calls", n)
	}
	evs := trail(t, c, id)
	if n := len(ofType(evs, audit.EventRetried)); n != 0 {
		t.Errorf("%d capability.retried events after a cancel", n)
	}
	last := evs[len(evs)-1]
	if last.Type != audit.EventCancelled || last.Data["code"] != string(envelope.CodeCancelled) || intValue(last.Data["attempts"]) != 1 {
		t.Errorf("terminal event %s %v", last.Type, last.Data)
	}
}

// TestCancel_BeforeAnyWorkerClaimsIt: the cancel is recorded on the execution
// record, so the worker that later receives the request finalizes it
// cancelled without calling the handler.
func TestCancel_BeforeAnyWorkerClaimsIt(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	js, err := demo.Provision(ctxT(t), env.Connect(t), 1)
	if err != nil {
		t.Fatal(err)
	}
	// A demo worker publishes the catalog (so requests are routed to its pool)
	// and leaves: nobody pulls demo requests now.
	_, stop := runWorker(t, env.Connect(t), executor.WorkerConfig{Pool: "demo"}, demo.Catalog(js)...)
	stop()
	// Another pool's worker answers cancel requests meanwhile.
	var otherCalls atomic.Int64
	startWorker(t, env.Connect(t), executor.WorkerConfig{Pool: "other"},
		failing("other.task", executor.Meta{SideEffect: executor.SideEffectNone}, false, &otherCalls))
	c := newClient(t, env.Connect(t))
	ctx := ctxT(t)

	id, err := c.Submit(ctx, "demo.sleep", demo.SleepInput{Ms: 60000}, executor.As(alice))
	if err != nil {
		t.Fatal(err)
	}
	reply, err := c.Cancel(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if reply.State != execution.StatePending {
		t.Fatalf("cancel reply %+v, want the pending state", reply)
	}

	w := startWorker(t, env.Connect(t), executor.WorkerConfig{Pool: "demo"}, demo.Catalog(js)...)
	got, err := c.Await(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	wantCancelled(t, got, 0)
	if n := w.Stats().HandlerCalls; n != 0 {
		t.Errorf("the handler was called %d times", n)
	}
	evs := trail(t, c, id)
	if got := typesOf(evs); len(got) != 2 || got[0] != audit.EventRequested || got[1] != audit.EventCancelled {
		t.Errorf("trail %v, want requested then cancelled", got)
	}
	// The record is finalized after the envelope is written.
	waitState(t, c, id, execution.StateFinalized)
	s, err := c.Status(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if r := s.Record; r.State != execution.StateFinalized || r.Status != envelope.StatusCancelled || r.CapabilityID != "demo.sleep" || !r.CancelRequested {
		t.Errorf("record %+v", r)
	}
}

// retryingForever fails retryably with a backoff long enough that only a
// cancel or a deadline ends the execution.
func retryingForever(id string, calls *atomic.Int64) executor.Capability {
	return failing(id, executor.Meta{SideEffect: executor.SideEffectRead,
		Retry: &executor.Retry{MaxAttempts: 3, Backoff: 10 * time.Minute}}, true, calls)
}

// TestCancel_DuringBackoffIsTerminal: the next attempt never starts.
func TestCancel_DuringBackoffIsTerminal(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	var calls atomic.Int64
	startWorker(t, env.Connect(t), executor.WorkerConfig{}, retryingForever("stock.read", &calls))
	c := newClient(t, env.Connect(t))
	ctx := ctxT(t)

	id, err := c.Submit(ctx, "stock.read", nil)
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, c, id, execution.StateBackoff)
	if _, err := c.Cancel(ctx, id); err != nil {
		t.Fatal(err)
	}
	got, err := c.Await(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	wantCancelled(t, got, 1)
	if n := calls.Load(); n != 1 {
		t.Errorf("%d handler calls", n)
	}
	if n := len(ofType(trail(t, c, id), audit.EventRetried)); n != 0 {
		t.Errorf("%d capability.retried events", n)
	}
}

// TestDeadline_EndsTheExecutionAtAnyPoint: the request's deadline spans the
// whole execution: before the claim, during an attempt, during a backoff.
func TestDeadline_EndsTheExecutionAtAnyPoint(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	var blockCalls, retryCalls atomic.Int64
	startWorker(t, env.Connect(t), executor.WorkerConfig{},
		blocking("report.build", executor.Meta{SideEffect: executor.SideEffectRead, Timeout: 10 * time.Minute}, &blockCalls),
		retryingForever("stock.read", &retryCalls))
	c := newClient(t, env.Connect(t))

	for _, tc := range []struct {
		name     string
		capID    string
		in       time.Duration
		calls    *atomic.Int64
		attempts int
	}{
		{"before the claim", "report.build", -time.Second, &blockCalls, 0},
		{"during an attempt", "report.build", time.Second, &blockCalls, 1},
		{"during a backoff", "stock.read", time.Second, &retryCalls, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A deadline that passes before a slow machine starts the
			// attempt proves the case before the claim: try again with a
			// deadline twice as far, a bounded number of times.
			var got *envelope.Envelope
			var before int64
			for in := tc.in; ; in *= 2 {
				before = tc.calls.Load()
				var err error
				got, err = c.Call(ctxT(t), tc.capID, nil, executor.WithDeadline(time.Now().Add(in)))
				if err != nil {
					t.Fatal(err)
				}
				if tc.attempts == 0 || got.Attempts != 0 || in >= 16*tc.in {
					break
				}
				t.Logf("the deadline %v away passed before the attempt started; again with %v", in, 2*in)
			}
			wantCancelled(t, got, tc.attempts)
			if got.Error.Message != "The request's deadline passed." {
				t.Errorf("message %q", got.Error.Message)
			}
			if n := tc.calls.Load() - before; n != int64(tc.attempts) {
				t.Errorf("%d handler calls", n)
			}
		})
	}
}

// TestLateResult_NeverWaitedForNorUsed: after a cancel or a timeout the
// worker finalizes at once, while the handler (which ignores its context)
// still runs; the abandoned handler is counted and its output discarded.
func TestLateResult_NeverWaitedForNorUsed(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	release := make(chan struct{})
	defer close(release)
	started := make(chan string, 2)
	stubborn := func(id string, timeout time.Duration) executor.Capability {
		return executor.Define(id, executor.Meta{
			Description: "Ignores its context.", Expose: executor.On(executor.SurfaceDirect),
			SideEffect: executor.SideEffectRead, Timeout: timeout,
		}, func(ctx context.Context, c executor.Call[none]) (map[string]any, error) {
			started <- c.ExecutionID
			<-release
			return map[string]any{"late": true}, nil
		})
	}
	w := startWorker(t, env.Connect(t), executor.WorkerConfig{},
		stubborn("report.cancelled", 10*time.Minute), stubborn("report.timed-out", 50*time.Millisecond))
	c := newClient(t, env.Connect(t))
	ctx := ctxT(t)

	id, err := c.Submit(ctx, "report.cancelled", nil)
	if err != nil {
		t.Fatal(err)
	}
	<-started
	if _, err := c.Cancel(ctx, id); err != nil {
		t.Fatal(err)
	}
	got, err := c.Await(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	wantCancelled(t, got, 1)
	if got.Output != nil {
		t.Errorf("output %v", got.Output)
	}

	got, err = c.Call(ctx, "report.timed-out", nil)
	if err != nil {
		t.Fatal(err)
	}
	<-started
	if got.Status != envelope.StatusCancelled || got.Error == nil || got.Error.Code != envelope.CodeTimeout || got.Attempts != 1 || got.Output != nil {
		t.Fatalf("status %s, attempts %d, error %+v", got.Status, got.Attempts, got.Error)
	}
	// Both handlers are still blocked: the envelopes did not wait for them.
	if s := w.Stats(); s.Abandoned != 2 || s.HandlerCalls != 2 {
		t.Errorf("stats %+v", s)
	}
}

// TestCancel_RecordedOnTheRecordAloneStopsTheRun: a worker that missed the
// cancel message still sees the cancel on the record when it renews its lease.
func TestCancel_RecordedOnTheRecordAloneStopsTheRun(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	var calls atomic.Int64
	startWorker(t, env.Connect(t), executor.WorkerConfig{Lease: 300 * time.Millisecond},
		blocking("report.build", executor.Meta{SideEffect: executor.SideEffectRead, Timeout: 10 * time.Minute}, &calls))
	c := newClient(t, env.Connect(t))
	ctx := ctxT(t)

	id, err := c.Submit(ctx, "report.build", nil)
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, c, id, execution.StateRunning)
	kv := testhooks.Broker(c).Executions
	for {
		rec, rev, err := broker.Load[execution.Record](ctx, kv, broker.Key(broker.Anonymous, id))
		if err != nil {
			t.Fatal(err)
		}
		rec.CancelRequested, rec.CancelRequestedAt = true, time.Now().UTC()
		if _, err := broker.Update(ctx, kv, broker.Key(broker.Anonymous, id), rec, rev); err == nil {
			break // else the lease renewal moved first: again
		}
	}
	got, err := c.Await(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	wantCancelled(t, got, 1)
	if n := calls.Load(); n != 1 {
		t.Errorf("%d handler calls", n)
	}
}

// TestCancel_AfterFinalizationChangesNothing: the envelope stands.
func TestCancel_AfterFinalizationChangesNothing(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	startWorker(t, env.Connect(t), executor.WorkerConfig{}, echoCap(nil))
	c := newClient(t, env.Connect(t))
	ctx := ctxT(t)

	got, err := c.Call(ctx, "demo.echo", map[string]any{"hello": "world"})
	if err != nil || got.Status != envelope.StatusCompleted {
		t.Fatalf("%v %+v", err, got)
	}
	reply, err := c.Cancel(ctx, got.ExecutionID)
	if err != nil {
		t.Fatal(err)
	}
	if !reply.Finalized || reply.Status != envelope.StatusCompleted {
		t.Errorf("cancel reply %+v", reply)
	}
	s, err := c.Status(ctx, got.ExecutionID)
	if err != nil {
		t.Fatal(err)
	}
	if s.Envelope.Status != envelope.StatusCompleted || s.Record.CancelRequested {
		t.Errorf("after the cancel: envelope %s, record %+v", s.Envelope.Status, s.Record)
	}
}

// TestCancel_DuringPolicyEvaluationIsCancelled: a policy cut off by the
// cancel does not turn the outcome into POLICY_FAILED.
func TestCancel_DuringPolicyEvaluationIsCancelled(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	evaluating := make(chan struct{}, 1)
	slow := executor.Policy{Name: "slow-risk-check", Evaluate: func(ctx context.Context, r executor.PolicyRequest) (executor.Decision, error) {
		evaluating <- struct{}{}
		<-ctx.Done()
		return executor.Decision{}, ctx.Err()
	}}
	var calls atomic.Int64
	startWorker(t, env.Connect(t), executor.WorkerConfig{PolicyTimeout: 10 * time.Minute},
		failing("report.build", executor.Meta{SideEffect: executor.SideEffectRead, Policies: []executor.Policy{slow}}, false, &calls))
	c := newClient(t, env.Connect(t))
	ctx := ctxT(t)

	id, err := c.Submit(ctx, "report.build", nil)
	if err != nil {
		t.Fatal(err)
	}
	<-evaluating
	if _, err := c.Cancel(ctx, id); err != nil {
		t.Fatal(err)
	}
	got, err := c.Await(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	wantCancelled(t, got, 0)
	if n := calls.Load(); n != 0 {
		t.Errorf("%d handler calls", n)
	}
}

// A cancel of an id nothing is stored of (no request in its queue, no record,
// no envelope) says there is no such execution and records nothing: a status
// or an await of it afterwards still answers at once that it does not exist,
// and a request later submitted under that id runs. A UUIDv7 made a moment
// ago is another matter: its request may be on its way, so the cancel is
// recorded for it.
func TestCancel_OfNothing_NoSuchExecution_RecordsNothing(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	var calls atomic.Int64
	runWorker(t, env.Connect(t), executor.WorkerConfig{Pool: "p"}, echoCap(&calls))
	c := newClient(t, env.Connect(t))
	ctx := ctxT(t)
	old := uuidV7At(time.Now().Add(-time.Minute))
	for _, id := range []string{"not-an-execution", old} {
		reply, err := c.Cancel(ctx, id)
		if !errors.Is(err, executor.ErrNoSuchExecution) {
			t.Fatalf("cancel %s: %+v, %v; want ErrNoSuchExecution", id, reply, err)
		}
		if _, err := c.Status(ctx, id); !errors.Is(err, executor.ErrNoSuchExecution) {
			t.Fatalf("status of %s after the cancel: %v; want unknown (nothing recorded)", id, err)
		}
		if _, err := c.Await(ctx, id); !errors.Is(err, executor.ErrNoSuchExecution) {
			t.Fatalf("await of %s after the cancel: %v", id, err)
		}
	}
	got, err := c.Call(ctx, "demo.echo", echoIn{Hello: "again"}, executor.As(alice), executor.WithID(old))
	if err != nil || got.Status != envelope.StatusCompleted {
		t.Fatalf("a call under the id the cancel named: %v %+v", err, got)
	}

	fresh := envelope.NewExecutionID()
	reply, err := c.Cancel(ctx, fresh)
	if err != nil || reply.State != execution.StatePending {
		t.Fatalf("cancel of an id just made: %+v, %v; want recorded as pending", reply, err)
	}
}

// Await of an id made a moment ago waits for its request (it may be on its
// way), and asks the workers again once the id is two seconds old: a request
// that never arrives ends the wait with ErrNoSuchExecution then, long before
// the caller's own deadline.
func TestAwait_YoungIDThatNeverArrives_AskedAgainOnceOldEnough(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	runWorker(t, env.Connect(t), executor.WorkerConfig{Pool: "p"}, echoCap(nil))
	c := newClient(t, env.Connect(t))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	id := envelope.NewExecutionID()
	if _, err := c.Await(ctx, id); !errors.Is(err, executor.ErrNoSuchExecution) {
		t.Fatalf("await of a young id never submitted: %v, want ErrNoSuchExecution", err)
	}
	if ctx.Err() != nil {
		t.Fatal("the await waited for its whole deadline")
	}
	// A young id whose request comes meanwhile is awaited to its end.
	id = envelope.NewExecutionID()
	done := make(chan error, 1)
	go func() {
		got, err := c.Await(ctx, id)
		if err == nil && got.Status != envelope.StatusCompleted {
			err = errors.New(string(got.Status))
		}
		done <- err
	}()
	if _, err := c.Submit(ctx, "demo.echo", echoIn{Hello: "late"}, executor.As(alice), executor.WithID(id)); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("await of a young id submitted meanwhile: %v", err)
	}
}

// A cancel of a write whose attempt was running when its worker was lost
// stops nothing: the worker that takes it over ends it CANCELLED, saying
// the attempt may have taken effect, not as if nothing had run.
func TestCancel_OfAnAttemptLostWithItsWorker_SaysItMayHaveTakenEffect(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	s := newStore(t, env)
	sent, release := make(chan struct{}, 1), make(chan struct{})
	t.Cleanup(func() { close(release) })
	send := executor.Define("t.lost-send", executor.Meta{Description: "Sends, then hangs past its worker's stop.",
		Expose: executor.On(executor.SurfaceDirect), SideEffect: executor.SideEffectExternal},
		func(context.Context, executor.Call[struct{}]) (bool, error) {
			sent <- struct{}{} // the effect
			<-release
			return true, nil
		})
	stop := startWorkerUntil(t, env.Connect(t), executor.WorkerConfig{Lease: 2 * time.Second, Grace: 50 * time.Millisecond}, send)
	ctx := ctxT(t)
	id, err := s.c.Submit(ctx, "t.lost-send", struct{}{})
	if err != nil {
		t.Fatal(err)
	}
	<-sent
	stop() // lost mid-attempt: its handler abandoned to a takeover
	// A worker of another pool records the cancel (a cancel goes through
	// the workers); the worker that takes the execution over starts after.
	startWorker(t, env.Connect(t), executor.WorkerConfig{Pool: "bystander"}, echoCap(nil))
	if _, err := s.c.Cancel(ctx, id); err != nil {
		t.Fatal(err)
	}
	startWorker(t, env.Connect(t), executor.WorkerConfig{Lease: 2 * time.Second}, send)
	env2, err := s.c.Await(ctx, id)
	if err != nil || env2.Status != envelope.StatusCancelled || env2.Error.Code != envelope.CodeCancelled {
		t.Fatalf("the cancelled call: %v %+v %+v", err, env2, env2.Error)
	}
	if m := env2.ForModel().Message; !strings.Contains(m, "may have taken effect") {
		t.Errorf("the cancelled call says %q: the attempt lost with its worker ran", m)
	}
}
