package engine

import (
	"errors"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
)

// How an execution writes its end (DESIGN §5, §14), on a real store: the
// lease is proved before the envelope unless plenty of it is left; a
// worker that lost its claim discards its outcome; the envelope is written
// once, and a second finalization is audited, never written over the first.

// claimed makes x hold a record of its own, its lease until leaseUntil.
func claimed(t *testing.T, x *execution, leaseUntil time.Time) {
	t.Helper()
	rec := x.newRecord(StateRunning)
	rec.LeaseUntil = leaseUntil
	if !x.create(rec) {
		t.Fatal("claim not created")
	}
}

// takenOver has another worker take x's record over.
func takenOver(t *testing.T, r *Runner, x *execution) {
	t.Helper()
	other := r.newClaim(x.key)
	cur, rev, err := r.w.store.load(x.key)
	if err != nil {
		t.Fatal(err)
	}
	other.hold(cur, rev)
	if err := other.update(func(rec *Record) { rec.Worker, rec.Claim = "w-other", other.token }); err != nil {
		t.Fatal(err)
	}
}

// With less than half its lease left, a finalization proves the claim
// first: one lost to another worker discards its outcome, audited, and
// writes no envelope.
func TestFinalize_LostClaim_OutcomeDiscarded(t *testing.T) {
	t.Parallel()
	r := testRunner(t)
	x := testExecution(t, r, nil)
	claimed(t, x, time.Now().Add(time.Second)) // a 30 s lease, nearly out
	takenOver(t, r, x)
	if _, written := x.end(completed(mustRaw("done")), 1); written {
		t.Fatal("a worker that lost its claim reports its envelope written")
	}
	if env, err := r.w.store.envelope(x.key); env != nil || err != nil {
		t.Fatalf("envelope %+v (%v) written by a worker that lost its claim", env, err)
	}
	if got := trailOf(t, r, x); count(got, audit.EventEnvelopeConflict) != 1 {
		t.Fatalf("trail %v: the discarded outcome is not audited", got)
	}
}

// A failure's private cause is written on the record, with the lease's
// renewal, before the envelope, however much of the lease is left: the
// record is not written after the envelope.
func TestFinalize_FailureCauseRecordedBeforeTheEnvelope(t *testing.T) {
	t.Parallel()
	r := testRunner(t)
	x := testExecution(t, r, nil)
	claimed(t, x, time.Now().Add(30*time.Second)) // the whole lease left
	cerr := handlerError(errors.New("disk full on host-7"))
	if _, written := x.end(failedAfterRun(cerr), 1); !written {
		t.Fatal("envelope not written")
	}
	rec, _, err := r.w.store.load(x.key)
	if err != nil || rec.Cause != "disk full on host-7" {
		t.Fatalf("record %+v (%v): want the failure's cause on it", rec, err)
	}
}

// The envelope is created once: a second finalization finds the first
// one's envelope, keeps it, is acknowledged, and is audited as a conflict.
func TestFinalize_SecondFinalizationKeepsTheFirstAndIsAudited(t *testing.T) {
	t.Parallel()
	r := testRunner(t)
	x := testExecution(t, r, nil)
	claimed(t, x, time.Now().Add(30*time.Second))
	otherWorkersEnvelope(t, r.w, x.req.ExecutionID)
	if _, written := x.end(failedAfterRun(handlerError(errors.New("boom"))), 2); !written {
		t.Fatal("a delivery whose execution has its envelope is left unacknowledged")
	}
	if env, _ := r.w.store.envelope(x.key); env == nil || env.FinalizedBy != "w-other" || env.Status != envelope.StatusCompleted {
		t.Fatalf("envelope %+v: want the first finalization's", env)
	}
	if got := trailOf(t, r, x); count(got, audit.EventEnvelopeConflict) != 1 {
		t.Fatalf("trail %v: the second finalization is not audited", got)
	}
	if s := r.Stats(); s.Conflicts != 1 || s.Finalized != 0 {
		t.Fatalf("stats %+v: want one conflict, nothing finalized here", s)
	}
}

// The envelope a finalized record stands for is created, never written
// over one that exists.
func TestEndRecorded_NeverWritesOverAnEnvelope(t *testing.T) {
	t.Parallel()
	r := testRunner(t)
	x := testExecution(t, r, nil)
	otherWorkersEnvelope(t, r.w, x.req.ExecutionID)
	rec := r.w.finalizedRecord(x.req.ExecutionID, testOp, envelope.StatusFailed, envelope.CodeNotStarted)
	if !x.endRecorded(rec) {
		t.Fatal("an envelope exists: the delivery may be acknowledged")
	}
	if env, _ := r.w.store.envelope(x.key); env == nil || env.FinalizedBy != "w-other" || env.Status != envelope.StatusCompleted {
		t.Fatalf("envelope %+v: the record's envelope was written over the one there", env)
	}
}
