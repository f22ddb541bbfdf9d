package executor_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/capstantest"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/execrpc"
	"github.com/capstan-dev/capstan/internal/oplog"
	"github.com/capstan-dev/capstan/internal/pauses"
	"github.com/capstan-dev/capstan/internal/testhooks"
)

// countedCap is a capability whose handler counts its calls and, while gate is
// set, waits for it to close before it returns.
func countedCap(id string, calls *atomic.Int64, gate chan struct{}) executor.Capability {
	return executor.Define(id, executor.Meta{Description: "Counts its calls.", Expose: executor.On(executor.SurfaceDirect),
		SideEffect: executor.SideEffectExternal},
		func(ctx context.Context, c executor.Call[struct {
			N int `json:"n"`
		}]) (int, error) {
			calls.Add(1)
			if gate != nil {
				select {
				case <-gate:
				case <-ctx.Done():
					return 0, ctx.Err()
				}
			}
			return c.Input.N, nil
		})
}

// pause puts a pause in force as an admin of an open server would, and
// waits until every worker that answers has applied it; it returns the
// workers' confirmations.
func pause(t *testing.T, nc *nats.Conn, p pauses.Pause) (*pauses.Change, []oplog.AppliedReply) {
	t.Helper()
	if p.Mode == "" {
		p.Mode = pauses.Hold
	}
	if p.Reason == "" {
		p.Reason = "testing"
	}
	p.By = broker.Anonymous
	ch, err := pauses.Apply(ctxT(t), nc, broker.NewNames(""), &p)
	if err != nil {
		t.Fatal(err)
	}
	replies, err := oplog.Confirm(ctxT(t), nc, broker.NewNames(""), oplog.Pauses, ch.Revision, ch.AuditID, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range replies {
		if !r.Applied {
			t.Fatalf("worker %s did not apply revision %d: %+v", r.Worker, ch.Revision, r)
		}
	}
	return ch, replies
}

func unpause(t *testing.T, nc *nats.Conn, s pauses.Scope) {
	t.Helper()
	ch, err := pauses.Lift(ctxT(t), nc, broker.NewNames(""), s, broker.Anonymous, "tester", "done testing")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := oplog.Confirm(ctxT(t), nc, broker.NewNames(""), oplog.Pauses, ch.Revision, "", 5*time.Second); err != nil {
		t.Fatal(err)
	}
}

// A pause that holds: once the workers confirm it, no handler of the paused
// capability starts; the calls made meanwhile wait in their queue, another
// capability runs as ever; once lifted, every held call runs, once.
func TestPause_HeldCallsWaitThenRunOnceEach(t *testing.T) {
	t.Parallel()
	var sends, echoes atomic.Int64
	reg, err := executor.NewRegistry(countedCap("t.send", &sends, nil), echoCap(&echoes))
	if err != nil {
		t.Fatal(err)
	}
	w := trackedWorker(t, reg)
	w2 := trackedWorker(t, reg, capstantest.WithConn(w.Connect(t)))
	nc := w.Connect(t)
	c := w.Client(t, executor.ClientConfig{Actor: alice})

	_, replies := pause(t, nc, pauses.Pause{Scope: pauses.Scope{Capability: "t.send"}, Reason: "mail to the wrong list"})
	if len(replies) != 2 {
		t.Fatalf("%d workers confirmed the pause, want 2: %+v", len(replies), replies)
	}
	const n = 20
	ids := make([]string, n)
	for i := range ids {
		if ids[i], err = c.Submit(ctxT(t), "t.send", map[string]int{"n": i}); err != nil {
			t.Fatal(err)
		}
	}
	// Another capability is not held back.
	if env, err := c.Call(ctxT(t), "demo.echo", map[string]string{"hello": "x"}); err != nil || env.Status != envelope.StatusCompleted {
		t.Fatalf("an unpaused capability: %v %+v", err, env)
	}
	// Every held call has been delivered and put back at least twice (its
	// second delivery records it as held): the workers have seen them all.
	waitUntil(t, "every held call put back twice", func() bool {
		return w.Stats().Held+w2.Stats().Held >= 2*n
	})
	if got := sends.Load(); got != 0 {
		t.Fatalf("%d handler calls of a paused capability", got)
	}
	for _, id := range ids {
		st, err := c.Status(ctxT(t), id)
		if err != nil {
			t.Fatal(err)
		}
		if st.Envelope != nil {
			t.Fatalf("held call %s ended while paused: %+v", id, st.Envelope)
		}
	}
	// The listing says they wait in their queue, not that they run.
	flushAudit(t)
	// filtered: the listing asks for status alone.
	listed := func(status string, filtered bool) func() bool {
		return func() bool {
			q := audit.Query{CapabilityID: "t.send", Limit: 2 * n}
			if filtered {
				q.Status = status
			}
			page, err := c.Executions(ctxT(t), executor.ExecutionsRequest{Query: q})
			if err != nil {
				t.Fatal(err)
			}
			seen := map[string]bool{}
			for _, e := range page.Entries {
				if e.Status == status {
					seen[e.ExecutionID] = true
				}
			}
			return len(seen) == n && len(page.Entries) == n
		}
	}
	waitUntil(t, "every held call listed queued", listed(audit.EntryQueued, false))
	waitUntil(t, "every held call listed by --status queued", listed(audit.EntryQueued, true))

	unpause(t, nc, pauses.Scope{Capability: "t.send"})
	for i, id := range ids {
		env, err := c.Await(ctxT(t), id)
		if err != nil || env.Status != envelope.StatusCompleted || env.Attempts != 1 {
			t.Fatalf("held call %d after the pause: %v %+v", i, err, env)
		}
	}
	if got := sends.Load(); got != n {
		t.Fatalf("%d handler calls for %d held calls, want one each", got, n)
	}
	flushAudit(t)
	waitUntil(t, "every held call listed completed", listed(audit.EntryCompleted, false))
	// Asked for queued or running ones alone, a listing shows none of them:
	// from the workers and from an admin's own reading (no worker answers);
	// nor queued ones once their envelopes and records have gone (the index
	// keeps its entries longer).
	admin, err := broker.OpenAll(ctxT(t), nc, broker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	none := func(when string, statuses ...string) {
		t.Helper()
		for _, status := range statuses {
			q := audit.Query{CapabilityID: "t.send", Status: status, Limit: 2 * n}
			page, err := c.Executions(ctxT(t), executor.ExecutionsRequest{Query: q})
			if err != nil || len(page.Entries) != 0 {
				t.Fatalf("%s: --status %s lists %d calls that have ended (%v): %+v", when, status, len(page.Entries), err, page.Entries)
			}
			own, _, _, err := execrpc.ListWithQueued(ctxT(t), admin, q, true)
			if err != nil || len(own) != 0 {
				t.Fatalf("%s: an admin's own listing of %s ones lists %d calls that have ended (%v)", when, status, len(own), err)
			}
		}
	}
	none("ended", audit.EntryQueued, audit.EntryRunning)
	for _, id := range ids {
		for _, kv := range []jetstream.KeyValue{admin.Envelopes, admin.Executions} {
			if err := kv.Purge(ctxT(t), broker.Key(broker.Anonymous, id)); err != nil {
				t.Fatal(err)
			}
		}
	}
	// (A running entry, whose execution may have no record, is judged by
	// its envelope, and once that went, stays for the envelopes' retention:
	// TestEnvelopeRetention_AnEndedCallIsNotListedRunningOnceItsEnvelopeExpired.)
	none("their envelopes and records gone", audit.EntryQueued)
	// The trail says the call was held, once recorded, and then started.
	flushAudit(t)
	evs, err := c.Trail(ctxT(t), ids[0])
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	for _, ev := range evs {
		types = append(types, ev.Type)
	}
	trail := strings.Join(types, " ")
	if !strings.Contains(trail, audit.EventHeld) || strings.Count(trail, audit.EventRequested) != 1 ||
		strings.Count(trail, audit.EventStarted) != 1 || strings.Contains(trail, audit.EventTakenOver) {
		t.Errorf("trail of a held call: %s", trail)
	}
}

// A pause that refuses ends the calls it matches at once, PAUSED, with the
// operator's reason for the model; the calls of other actors run.
func TestPause_RefuseEndsPausedWithTheReason(t *testing.T) {
	t.Parallel()
	var sends atomic.Int64
	reg, err := executor.NewRegistry(countedCap("t.send", &sends, nil))
	if err != nil {
		t.Fatal(err)
	}
	w := trackedWorker(t, reg)
	nc := w.Connect(t)
	pause(t, nc, pauses.Pause{Scope: pauses.Scope{Actor: "user:alice"}, Mode: pauses.Refuse, Reason: "refund loop under investigation"})
	ann := w.Client(t, executor.ClientConfig{Actor: alice})
	env, err := ann.Call(ctxT(t), "t.send", map[string]int{"n": 1})
	if err != nil || env.Status != envelope.StatusFailed || env.Error.Code != envelope.CodePaused {
		t.Fatalf("alice's call while she is paused: %v %+v", err, env)
	}
	m := env.ForModel()
	if m.Code != envelope.CodePaused || !strings.Contains(m.Message, "refund loop under investigation") || !m.Retryable {
		t.Errorf("the model is shown %+v", m)
	}
	bob := w.Client(t, executor.ClientConfig{Actor: envelope.Actor{Kind: "user", ID: "bob"}})
	if env, err := bob.Call(ctxT(t), "t.send", map[string]int{"n": 2}); err != nil || env.Status != envelope.StatusCompleted {
		t.Fatalf("bob's call: %v %+v", err, env)
	}
	if got := sends.Load(); got != 1 {
		t.Fatalf("%d handler calls, want bob's alone", got)
	}
	if s := w.Stats(); s.PauseRefused != 1 {
		t.Errorf("refused count %d, want 1", s.PauseRefused)
	}
	// Describe marks the paused capability for alice, not for bob.
	d, err := ann.Describe(ctxT(t), "", envelope.Actor{}, executor.Scope{})
	if err != nil || len(d.Capabilities) != 1 || d.Capabilities[0].Paused == nil || !d.Capabilities[0].Paused.Refuse {
		t.Fatalf("alice's description: %v %+v", err, d)
	}
	if d, err := bob.Describe(ctxT(t), "", envelope.Actor{}, executor.Scope{}); err != nil || d.Capabilities[0].Paused != nil {
		t.Fatalf("bob's description: %v %+v", err, d)
	}
}

// A worker started while a pause is on honours it from its first delivery.
func TestPause_WorkerStartedWhilePausedHonoursIt(t *testing.T) {
	t.Parallel()
	var sends atomic.Int64
	reg, err := executor.NewRegistry(countedCap("t.send", &sends, nil))
	if err != nil {
		t.Fatal(err)
	}
	first := trackedWorker(t, reg)
	nc := first.Connect(t)
	c := first.Client(t, executor.ClientConfig{Actor: alice})
	pause(t, nc, pauses.Pause{Scope: pauses.Scope{}, Reason: "stop everything"})
	first.Stop()
	id, err := c.Submit(ctxT(t), "t.send", map[string]int{"n": 1})
	if err != nil {
		t.Fatal(err)
	}
	w := trackedWorker(t, reg, capstantest.WithConn(first.Connect(t)))
	waitUntil(t, "the call put back twice", func() bool { return w.Stats().Held >= 2 })
	if got := sends.Load(); got != 0 {
		t.Fatalf("%d handler calls while everything is paused", got)
	}
	unpause(t, nc, pauses.Scope{})
	if env, err := c.Await(ctxT(t), id); err != nil || env.Status != envelope.StatusCompleted {
		t.Fatalf("after the pause: %v %+v", err, env)
	}
}

// --cancel-running: the running attempts the pause matches are cancelled
// as their callers' cancels are, and every worker says how many it
// cancelled; a held call's own cancel ends it while the pause lasts.
func TestPause_CancelRunningAndCancelOfAHeldCall(t *testing.T) {
	t.Parallel()
	var sends atomic.Int64
	gate := make(chan struct{})
	reg, err := executor.NewRegistry(countedCap("t.send", &sends, gate))
	if err != nil {
		t.Fatal(err)
	}
	w := trackedWorker(t, reg)
	nc := w.Connect(t)
	c := w.Client(t, executor.ClientConfig{Actor: alice})
	running, err := c.Submit(ctxT(t), "t.send", map[string]int{"n": 1})
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the handler runs", func() bool { return sends.Load() == 1 })
	_, replies := pause(t, nc, pauses.Pause{Scope: pauses.Scope{Capability: "t.send"}, CancelRunning: true, Reason: "stop it now"})
	if len(replies) != 1 || replies[0].Cancelled != 1 {
		t.Fatalf("confirmations %+v, want one worker that cancelled one attempt", replies)
	}
	env, err := c.Await(ctxT(t), running)
	if err != nil || env.Status != envelope.StatusCancelled || env.Error.Code != envelope.CodeCancelled {
		t.Fatalf("the running call: %v %+v", err, env)
	}
	if m := env.ForModel().Message; !strings.Contains(m, "operator") || !strings.Contains(m, "stop it now") {
		t.Errorf("the cancelled call says %q: want the operator's pause and reason, not the caller's cancel", m)
	}
	held, err := c.Submit(ctxT(t), "t.send", map[string]int{"n": 2})
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the call put back twice", func() bool { return w.Stats().Held >= 2 })
	if _, err := c.Cancel(ctxT(t), held); err != nil {
		t.Fatal(err)
	}
	env, err = c.Await(ctxT(t), held)
	if err != nil || env.Status != envelope.StatusCancelled {
		t.Fatalf("a held call its caller cancelled: %v %+v", err, env)
	}
	if got := sends.Load(); got != 1 {
		t.Fatalf("%d handler calls, want the first alone", got)
	}
}

// A held call keeps its start deadline: it ends NOT_STARTED, never run.
func TestPause_HeldCallEndsAtItsStartDeadline(t *testing.T) {
	t.Parallel()
	var sends atomic.Int64
	reg, err := executor.NewRegistry(countedCap("t.send", &sends, nil))
	if err != nil {
		t.Fatal(err)
	}
	w := trackedWorker(t, reg)
	nc := w.Connect(t)
	c := w.Client(t, executor.ClientConfig{Actor: alice})
	pause(t, nc, pauses.Pause{Scope: pauses.Scope{Capability: "t.send"}})
	env, err := c.Call(ctxT(t), "t.send", map[string]int{"n": 1}, executor.StartWithin(3*time.Second))
	if err != nil || env.Status != envelope.StatusFailed || env.Error.Code != envelope.CodeNotStarted {
		t.Fatalf("a held call past its start deadline: %v %+v", err, env)
	}
	if got := sends.Load(); got != 0 {
		t.Fatalf("%d handler calls", got)
	}
}

// A retry waits in place while its capability is paused: its claim kept,
// its next attempt started once the pause is lifted, as the retry it is.
func TestPause_RetryWaitsInPlace(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	first := make(chan struct{})
	release := make(chan struct{})
	flaky := executor.Define("t.flaky", executor.Meta{Description: "Fails once.", Expose: executor.On(executor.SurfaceDirect),
		SideEffect: executor.SideEffectRead, Retry: &executor.Retry{MaxAttempts: 1, Backoff: 50 * time.Millisecond}},
		func(ctx context.Context, c executor.Call[struct{}]) (int, error) {
			if calls.Add(1) == 1 {
				close(first)
				<-release
				return 0, &envelope.CapabilityError{Code: envelope.CodeExecutionFailed, Retryable: true, Message: "once"}
			}
			return c.Attempt, nil
		})
	reg, err := executor.NewRegistry(flaky)
	if err != nil {
		t.Fatal(err)
	}
	w := trackedWorker(t, reg)
	nc := w.Connect(t)
	c := w.Client(t, executor.ClientConfig{Actor: alice})
	id, err := c.Submit(ctxT(t), "t.flaky", struct{}{})
	if err != nil {
		t.Fatal(err)
	}
	<-first
	pause(t, nc, pauses.Pause{Scope: pauses.Scope{Capability: "t.flaky"}})
	close(release)
	// The failed attempt's backoff passes; the retry does not start.
	ctx, cancel := context.WithTimeout(ctxT(t), 500*time.Millisecond)
	_, err = c.Await(ctx, id)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the retry ended while paused: %v", err)
	}
	if got := calls.Load(); got != 1 {
		t.Fatalf("%d attempts while paused, want the first alone", got)
	}
	unpause(t, nc, pauses.Scope{Capability: "t.flaky"})
	env, err := c.Await(ctxT(t), id)
	if err != nil || env.Status != envelope.StatusCompleted || env.Attempts != 2 {
		t.Fatalf("after the pause: %v %+v", err, env)
	}
}

// A pause that refuses, put in force while an attempt runs, refuses its
// retry: the execution ends PAUSED after the attempt that ran, and the
// trail says that attempt ran.
func TestPause_ARefusedRetrySaysItsAttemptRan(t *testing.T) {
	t.Parallel()
	r := newRetryRig(t)
	calls, applied, nc, c := &r.calls, r.applied, r.nc, r.c
	id := r.submit(t)
	pause(t, nc, pauses.Pause{Scope: pauses.Scope{Capability: "t.reserve"}, Mode: pauses.Refuse, Reason: "stock recount"})
	close(applied)
	env, err := c.Await(ctxT(t), id)
	if err != nil || env.Status != envelope.StatusFailed || env.Error.Code != envelope.CodePaused || env.Attempts != 1 ||
		calls.Load() != 1 {
		t.Fatalf("the retry under a pause that refuses: %v %+v after %d calls", err, env, calls.Load())
	}
	flushAudit(t)
	evs, err := c.Trail(ctxT(t), id)
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range evs {
		if ev.Type == audit.EventFailed && ev.Data["executedBeforeFailure"] != true {
			t.Errorf("failed %+v: the first attempt ran", ev.Data)
		}
	}
}

// An attempt that passed its pause gate before the pause, its handler not
// begun yet (its record write slow, as when the executions bucket elects a
// leader): --cancel-running cancels it, and it never runs; a pause that
// holds is confirmed by the worker only once that attempt has begun, so
// that nothing the pause stops starts after the confirmation.
func TestPause_AnAttemptPastItsGateIsCancelledOrWaitedFor(t *testing.T) {
	t.Parallel()
	var sends atomic.Int64
	reg, err := executor.NewRegistry(countedCap("t.send", &sends, nil))
	if err != nil {
		t.Fatal(err)
	}
	at := make(chan string, 4)
	release := make(chan struct{})
	knobs := testhooks.WorkerKnobs{BeforeAttempt: func(id string, _ int) {
		at <- id
		<-release
	}}
	w := trackedWorker(t, reg, capstantest.WithConfig(testhooks.Worker(executor.WorkerConfig{}, knobs)))
	var once sync.Once
	releaseAll := func() { once.Do(func() { close(release) }) }
	t.Cleanup(releaseAll) // before the worker stops, whatever failed
	nc := w.Connect(t)
	c := w.Client(t, executor.ClientConfig{Actor: alice})

	// A pause that holds: while the attempt is held past its gate, the
	// worker does not confirm; once it begins, the worker does.
	id, err := c.Submit(ctxT(t), "t.send", map[string]int{"n": 1})
	if err != nil {
		t.Fatal(err)
	}
	<-at
	ch, err := pauses.Apply(ctxT(t), nc, broker.NewNames(""), &pauses.Pause{Scope: pauses.Scope{Capability: "t.send"},
		Mode: pauses.Hold, Reason: "held past the gate", By: broker.Anonymous})
	if err != nil {
		t.Fatal(err)
	}
	replies, err := oplog.Confirm(ctxT(t), nc, broker.NewNames(""), oplog.Pauses, ch.Revision, "", 5*time.Second)
	if err != nil || len(replies) != 1 || replies[0].Applied {
		t.Fatalf("a worker whose attempt past the gate has not begun confirms the pause: %v %+v", err, replies)
	}
	release <- struct{}{}
	if env, err := c.Await(ctxT(t), id); err != nil || env.Status != envelope.StatusCompleted {
		t.Fatalf("the attempt that passed its gate before the pause: %v %+v", err, env)
	}
	replies, err = oplog.Confirm(ctxT(t), nc, broker.NewNames(""), oplog.Pauses, ch.Revision, "", 5*time.Second)
	if err != nil || len(replies) != 1 || !replies[0].Applied {
		t.Fatalf("once it began, the worker confirms: %v %+v", err, replies)
	}
	unpause(t, nc, pauses.Scope{Capability: "t.send"})

	// --cancel-running: the attempt past its gate is cancelled, its
	// handler never called.
	id, err = c.Submit(ctxT(t), "t.send", map[string]int{"n": 2})
	if err != nil {
		t.Fatal(err)
	}
	<-at
	ch, err = pauses.Apply(ctxT(t), nc, broker.NewNames(""), &pauses.Pause{Scope: pauses.Scope{Capability: "t.send"},
		Mode: pauses.Hold, CancelRunning: true, Reason: "stop it now", By: broker.Anonymous})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan []oplog.AppliedReply, 1)
	go func() {
		replies, _ := oplog.Confirm(ctxT(t), nc, broker.NewNames(""), oplog.Pauses, ch.Revision, ch.AuditID, 5*time.Second)
		done <- replies
	}()
	// The cancel is recorded and the attempt's context ended while it is
	// held; let it go on to find it so.
	waitUntil(t, "the cancel recorded", func() bool {
		st, err := c.Status(ctxT(t), id)
		return err == nil && st.Record != nil && st.Record.CancelRequested
	})
	releaseAll()
	if replies := <-done; len(replies) != 1 || !replies[0].Applied || replies[0].Cancelled != 1 {
		t.Fatalf("confirmations %+v, want one worker that applied the pause and cancelled one attempt", replies)
	}
	env, err := c.Await(ctxT(t), id)
	if err != nil || env.Status != envelope.StatusCancelled {
		t.Fatalf("the attempt past its gate when the pause cancelled: %v %+v", err, env)
	}
	if got := sends.Load(); got != 1 {
		t.Fatalf("%d handler calls, want the first call's alone", got)
	}
}
