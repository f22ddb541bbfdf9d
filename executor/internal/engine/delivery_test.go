package engine

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
)

// The rules of a delivery's pass (DESIGN §5, §13, §14), each seen on what a
// real delivery leaves: records, envelopes, the trail, the message settled
// or not.

// The short path's claim is the record of attempt 1, created only if no
// record exists: a first delivery that finds another claim's record runs
// nothing, writes nothing over it, and files nothing of what it held.
func TestShortPath_AnotherClaimsRecord_NothingRunNothingFiled(t *testing.T) {
	t.Parallel()
	g := newRig(t, &testCap{}, nil)
	req := g.request()
	other := g.othersClaim(req, StateRunning, time.Now().Add(time.Minute))
	g.publish(req)
	g.handle(g.next())
	if n := g.c.calls.Load(); n != 0 {
		t.Fatalf("the handler ran %d times under another worker's live claim", n)
	}
	if rec := g.record(req); rec == nil || rec.Claim != other.token || rec.State != StateRunning {
		t.Fatalf("record %+v: want the other worker's, untouched", rec)
	}
	if got := g.trail(req); len(got) != 0 {
		t.Fatalf("trail %v: a delivery that did not claim filed events", got)
	}
}

// A request delivered again whose record is gone but whose envelope is
// there has ended: the claiming path reads the envelope before it runs,
// and the delivery is a duplicate.
func TestClaim_EnvelopeThereRecordGone_Duplicate(t *testing.T) {
	t.Parallel()
	g := newRig(t, &testCap{}, nil)
	req := g.request()
	otherWorkersEnvelope(t, g.r.w, req.ExecutionID)
	g.publish(req)
	g.handle(g.redelivered())
	if n := g.c.calls.Load(); n != 0 {
		t.Fatalf("an ended execution ran again (%d calls)", n)
	}
	if got := g.trail(req); count(got, audit.EventDuplicateDelivery) != 1 || count(got, audit.EventStarted) != 0 {
		t.Fatalf("trail %v: want a duplicate delivery, nothing started", got)
	}
}

// A request past its start deadline, with no record, ends NOT_STARTED
// without running.
func TestStartDeadline_PassedBeforeAnyClaim_EndsNotStarted(t *testing.T) {
	t.Parallel()
	g := newRig(t, &testCap{}, nil)
	req := g.request()
	past := time.Now().Add(-time.Second)
	req.StartBy = &past
	g.publish(req)
	g.handle(g.next())
	env := g.envelope(req)
	if env == nil || env.Status != envelope.StatusFailed || env.Error.Code != envelope.CodeNotStarted || g.c.calls.Load() != 0 {
		t.Fatalf("envelope %+v, %d calls: want NOT_STARTED, never run", env, g.c.calls.Load())
	}
}

// A request past its start deadline that has ended already is a duplicate:
// nothing of it is written again.
func TestStartDeadline_EndedRequestDeliveredAgain_Duplicate(t *testing.T) {
	t.Parallel()
	g := newRig(t, &testCap{}, nil)
	req := g.request()
	past := time.Now().Add(-time.Second)
	req.StartBy = &past
	otherWorkersEnvelope(t, g.r.w, req.ExecutionID)
	g.publish(req)
	g.handle(g.next())
	if rec := g.record(req); rec != nil {
		t.Fatalf("record %+v written for an execution that had ended", rec)
	}
	if got := g.trail(req); len(got) != 1 || got[0] != audit.EventDuplicateDelivery {
		t.Fatalf("trail %v: want one duplicate delivery", got)
	}
}

// A refused request (its message id names another execution) whose
// execution a cancel's pending record is in the way of ends as the
// takeover table says of that record: CANCELLED. Its delivery is settled
// only once that envelope exists: a request that left its queue without
// one would never be finalized.
func TestRefusal_CancelsPendingRecordInTheWay_EndsCancelled(t *testing.T) {
	t.Parallel()
	g := newRig(t, &testCap{}, nil)
	req := g.request()
	if _, err := g.r.RecordCancel("_anon", req.ExecutionID, true); err != nil {
		t.Fatal(err)
	}
	g.publishAs(req, g.r.w.ids.Request("_anon", envelope.NewExecutionID()))
	g.handle(g.next())
	if env := g.envelope(req); env == nil || env.Status != envelope.StatusCancelled {
		t.Fatalf("envelope %+v: want CANCELLED", env)
	}
	if n := g.pending(); n != 0 {
		t.Fatalf("%d deliveries unsettled", n)
	}
}

// attemptsOf runs one request on a rig whose handler always fails
// retryably, under retry, and returns how many times it ran and the
// envelope's attempts.
func attemptsOf(t *testing.T, retry func(n int, err *envelope.CapabilityError) (time.Duration, bool)) (int64, int) {
	t.Helper()
	fail := &envelope.CapabilityError{Code: envelope.CodeExecutionFailed, Message: "again", Retryable: true}
	g := newRig(t, &testCap{retry: retry, work: func(context.Context, Attempt) (any, error) { return nil, fail }}, nil)
	req := g.request()
	g.publish(req)
	g.handle(g.next())
	env := g.envelope(req)
	if env == nil {
		t.Fatal("no envelope")
	}
	return g.c.calls.Load(), env.Attempts
}

// The attempts are as many as the retry rule allows, no more: none again
// when it says no, and attempt n+1 only when it allows n to be followed.
func TestAttempts_AsManyAsTheRetryRuleAllows(t *testing.T) {
	t.Parallel()
	never := func(int, *envelope.CapabilityError) (time.Duration, bool) { return 0, false }
	if calls, n := attemptsOf(t, never); calls != 1 || n != 1 {
		t.Errorf("a rule that never retries: %d calls, %d attempts; want 1", calls, n)
	}
	upTo3 := func(n int, _ *envelope.CapabilityError) (time.Duration, bool) { return time.Millisecond, n < 3 }
	if calls, n := attemptsOf(t, upTo3); calls != 3 || n != 3 {
		t.Errorf("a rule allowing three attempts: %d calls, %d attempts; want 3", calls, n)
	}
}

// An attempt starts only once its record says so: a cancel recorded before
// that write ends the execution CANCELLED, the handler never called.
func TestAttemptStart_CancelRecordedFirst_HandlerNotCalled(t *testing.T) {
	t.Parallel()
	var g *rig
	var req *envelope.Request
	g = newRig(t, &testCap{}, func(c *Config) {
		c.BeforeAttempt = func(string, int) {
			if _, err := g.r.RecordCancel("_anon", req.ExecutionID, true); err != nil {
				t.Error(err)
			}
		}
	})
	req = g.request()
	g.publish(req)
	g.handle(g.redelivered()) // a redelivery claims before it runs
	if env := g.envelope(req); env == nil || env.Status != envelope.StatusCancelled || g.c.calls.Load() != 0 {
		t.Fatalf("envelope %+v, %d calls: want CANCELLED, never run", env, g.c.calls.Load())
	}
}

// A caller's deadline that passes during an attempt ends the execution
// CANCELLED, whatever the retry rule would say of the attempt's error.
func TestAttempt_DeadlineDuringIt_EndsCancelledNotFailed(t *testing.T) {
	t.Parallel()
	g := newRig(t, &testCap{work: func(ctx context.Context, _ Attempt) (any, error) {
		<-ctx.Done()
		return nil, errors.New("interrupted")
	}}, nil)
	req := g.request()
	deadline := time.Now().Add(300 * time.Millisecond)
	req.Deadline = &deadline
	g.publish(req)
	g.handle(g.next())
	if env := g.envelope(req); env == nil || env.Status != envelope.StatusCancelled || env.Error.Code != envelope.CodeCancelled {
		t.Fatalf("envelope %+v: want cancelled, CANCELLED", env)
	}
}

// A caller's deadline that passes during a backoff ends the execution at
// once, CANCELLED: the backoff is not waited out.
func TestBackoff_DeadlineDuringIt_EndsAtOnce(t *testing.T) {
	t.Parallel()
	fail := &envelope.CapabilityError{Code: envelope.CodeExecutionFailed, Message: "again", Retryable: true}
	g := newRig(t, &testCap{
		retry: func(int, *envelope.CapabilityError) (time.Duration, bool) { return time.Hour, true },
		work:  func(context.Context, Attempt) (any, error) { return nil, fail },
	}, nil)
	req := g.request()
	deadline := time.Now().Add(300 * time.Millisecond)
	req.Deadline = &deadline
	g.publish(req)
	done := make(chan struct{})
	go func() { defer close(done); g.handle(g.next()) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the backoff outlived the request's deadline")
	}
	if env := g.envelope(req); env == nil || env.Status != envelope.StatusCancelled || g.c.calls.Load() != 1 {
		t.Fatalf("envelope %+v, %d calls: want CANCELLED after one attempt", env, g.c.calls.Load())
	}
}

// A retry is decided again before it starts (the rules an operator put in
// force since): one refused ends the execution with the refusal, after the
// attempts that ran, the refusal's events filed and no retry.
func TestRecheck_ARefusedRetryEndsWithTheAttemptsThatRan(t *testing.T) {
	t.Parallel()
	fail := &envelope.CapabilityError{Code: envelope.CodeExecutionFailed, Message: "again", Retryable: true}
	refusal := &envelope.CapabilityError{Code: envelope.CodePolicyDenied, Stage: envelope.StagePolicy, Message: "No.", ExposeToModel: true}
	g := newRig(t, &testCap{
		retry: func(n int, _ *envelope.CapabilityError) (time.Duration, bool) { return 0, n < 2 },
		work:  func(context.Context, Attempt) (any, error) { return nil, fail },
		recheck: func() ([]Event, *envelope.CapabilityError) {
			return []Event{{Type: audit.EventDenied, Data: map[string]any{"reason": "policy-denied"}}}, refusal
		},
	}, nil)
	req := g.request()
	g.publish(req)
	g.handle(g.next())
	env := g.envelope(req)
	if env == nil || env.Status != envelope.StatusFailed || env.Error.Code != envelope.CodePolicyDenied || env.Attempts != 1 ||
		g.c.calls.Load() != 1 {
		t.Fatalf("envelope %+v after %d calls: want POLICY_DENIED after the one attempt that ran", env, g.c.calls.Load())
	}
	if got := g.trail(req); count(got, audit.EventDenied) != 1 || count(got, audit.EventRetried) != 0 {
		t.Fatalf("trail %v: want the denial filed and no retry", got)
	}
}

// The events the stages ask for (a denial's true reason) are filed before
// the engine acts on their decision.
func TestAdmission_StagesEventsFiled(t *testing.T) {
	t.Parallel()
	g := newRig(t, &testCap{admit: func(context.Context, Request) Admission {
		return Admission{Events: []Event{{Type: audit.EventDenied, Data: map[string]any{"reason": "policy: no"}}},
			Refusal: &envelope.CapabilityError{Code: envelope.CodePolicyDenied, Stage: envelope.StagePolicy, Message: "No.", ExposeToModel: true}}
	}}, nil)
	req := g.request()
	g.publish(req)
	g.handle(g.next())
	if got := g.trail(req); count(got, audit.EventDenied) != 1 {
		t.Fatalf("trail %v: the stages' denial is not filed", got)
	}
}

// A call that needs an approval is claimed before the approval is stored
// (the short path runs its stages unclaimed): its record reserves the
// approval's id, the one stored.
func TestApproval_ClaimedBeforeItIsStored(t *testing.T) {
	t.Parallel()
	var stored string
	var g *rig
	var req *envelope.Request
	g = newRig(t, &testCap{admit: func(context.Context, Request) Admission {
		return Admission{Approval: &ApprovalNeeded{Store: func(_ context.Context, id string) (*envelope.ApprovalRef, map[string]any, *envelope.CapabilityError) {
			if rec := g.record(req); rec == nil || rec.ApprovalID != id {
				t.Errorf("approval %s stored before the record reserving it (record %+v)", id, rec)
			}
			stored = id
			return &envelope.ApprovalRef{ID: id}, nil, nil
		}}}
	}}, nil)
	req = g.request()
	g.publish(req)
	g.handle(g.next())
	if env := g.envelope(req); env == nil || env.Status != envelope.StatusApprovalRequired || stored == "" {
		t.Fatalf("envelope %+v, approval %q: want approval-required", env, stored)
	}
}

// A read without a claim writes no record: its envelope alone ends it
// (DESIGN §14, "Reads without claims").
func TestUnclaimedRead_NoRecordWritten(t *testing.T) {
	t.Parallel()
	g := newRig(t, &testCap{unclaimed: true}, nil)
	req := g.request()
	g.publish(req)
	g.handle(g.next())
	if env := g.envelope(req); env == nil || env.Status != envelope.StatusCompleted {
		t.Fatalf("envelope %+v: want completed", env)
	}
	if rec := g.record(req); rec != nil {
		t.Fatalf("record %+v written for a read without a claim", rec)
	}
}

// A read without a claim whose queued request a cancel notice named reads
// its record first, and obeys the cancel recorded there.
func TestUnclaimedRead_CancelNoticed_ReadsTheRecordAndObeys(t *testing.T) {
	t.Parallel()
	g := newRig(t, &testCap{unclaimed: true}, nil)
	req := g.request()
	if _, err := g.r.RecordCancel("_anon", req.ExecutionID, true); err != nil {
		t.Fatal(err)
	}
	g.r.CancelLocal("_anon", req.ExecutionID) // nothing in flight: the notice is kept
	g.publish(req)
	g.handle(g.next())
	if env := g.envelope(req); env == nil || env.Status != envelope.StatusCancelled || g.c.calls.Load() != 0 {
		t.Fatalf("envelope %+v, %d calls: want CANCELLED, never run", env, g.c.calls.Load())
	}
}

// A worker that shuts down during an attempt gives the execution back: its
// lease ends now, so that a live worker takes it over at once.
func TestShutdown_ReleasesTheLease(t *testing.T) {
	t.Parallel()
	started := make(chan struct{})
	g := newRig(t, &testCap{work: func(ctx context.Context, _ Attempt) (any, error) {
		close(started)
		<-ctx.Done()
		return nil, ctx.Err()
	}}, nil)
	req := g.request()
	g.publish(req)
	done := make(chan struct{})
	go func() { defer close(done); g.handle(g.next()) }()
	<-started
	g.r.Stop()
	<-done
	rec := g.record(req)
	if rec == nil || rec.LeaseUntil.After(time.Now()) {
		t.Fatalf("record %+v: the lease of a worker that shut down still runs", rec)
	}
	if env := g.envelope(req); env != nil {
		t.Fatalf("envelope %+v written by a worker that shut down", env)
	}
}
