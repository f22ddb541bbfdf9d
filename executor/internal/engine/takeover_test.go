package engine

import (
	"fmt"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/envelope"
)

// TestTakeover is the takeover table of DESIGN §5, row by row: the rows of a
// record found (an envelope, a finalized record, a conflict, a live lease, an
// expired one in each state, a cancel), the rows of a missing record before
// the claim and once the claiming path holds its own (What a missing record
// proves), and the deadlines of §13 that bound them. No server, no clock:
// the table is a function of what a delivery found and the time.
func TestTakeover(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	live, expired := now.Add(10*time.Second), now.Add(-time.Second)
	before, after := now.Add(time.Hour), now.Add(-time.Hour) // a deadline still ahead, one passed
	record := func(st State, change func(r *Record)) *Record {
		r := &Record{ExecutionID: "e1", CapabilityID: "orders.refund", State: st, Worker: "w-dead", Claim: "c-dead",
			LeaseUntil: expired}
		if change != nil {
			change(r)
		}
		return r
	}
	attempt := func(n int) func(r *Record) { return func(r *Record) { r.Attempt = n } }
	deny := func(int) bool { return false }
	upTo := func(max int) func(int) bool { return func(n int) bool { return n < max } }
	// write is a capability no retry is allowed for (SI-11), read one with
	// two attempts.
	write := func(f Facts) Facts { f.Known, f.Retry, f.Timeout = true, deny, 30*time.Second; return f }
	read := func(f Facts) Facts { f.Known, f.Retry, f.Timeout = true, upTo(2), 5*time.Second; return f }
	unknown := func(f Facts) Facts { f.Known, f.Retry = false, nil; return f }
	// reconciling is a write with a reconciler, proving is one whose
	// reconciler proves absence (two attempts it may start), asked is what
	// it answered once this delivery held the record.
	reconciling := func(f Facts) Facts { f = write(f); f.Recovery = Recovery{Reconciles: true}; return f }
	proving := func(f Facts) Facts {
		f = write(f)
		f.Recovery = Recovery{Reconciles: true, ProvesAbsence: true, MaxReattempts: 2}
		return f
	}
	asked := func(v Verdict, f Facts) Facts { f.Claimed, f.Reconciled = true, v; return f }
	withReceipt := func(n int) func(r *Record) {
		return func(r *Record) { r.Attempt, r.Receipt, r.ReceiptAttempt = n, envelope.MustRaw("msg-1"), n }
	}
	lost := outcomeUnknown(lostWorkerMessage)
	expiredRecord := outcomeUnknown(expiredRecordMessage)

	for _, tc := range []struct {
		name string
		f    Facts
		want Action
	}{
		// A record and its envelope.
		{"an envelope for the id: a duplicate, whatever the record says",
			write(Facts{Record: record(StateRunning, func(r *Record) { r.LeaseUntil = live }), Envelope: EnvelopePresent}),
			Action{Do: Duplicate}},
		{"an envelope that does not decode: a duplicate all the same",
			write(Facts{Record: record(StateRunning, nil), Envelope: EnvelopeUndecodable}),
			Action{Do: Duplicate}},
		{"an envelope that could not be read: unknown is not absent, wait",
			write(Facts{Record: record(StateRunning, attempt(1)), Envelope: EnvelopeUnknown}),
			Action{Do: Wait, Delay: time.Second}},
		{"an envelope that could not be read, beside a finalized record: wait",
			write(Facts{Record: record(StateFinalized, nil), Envelope: EnvelopeUnknown}),
			Action{Do: Wait, Delay: time.Second}},
		{"a finalized record without its envelope: the envelope it stands for is written",
			write(Facts{Record: record(StateFinalized, nil), Envelope: EnvelopeAbsent}),
			Action{Do: RestoreEnvelope}},
		{"a finalized record with its envelope: a duplicate",
			write(Facts{Record: record(StateFinalized, nil), Envelope: EnvelopePresent}),
			Action{Do: Duplicate}},
		// Another request under the same id.
		{"a record claimed for another request: acknowledged, never run",
			write(Facts{Record: record(StateClaimed, nil), Envelope: EnvelopeAbsent, Conflict: "inputHash"}),
			Action{Do: Conflict, Field: "inputHash"}},
		{"a conflict is told before a live lease",
			write(Facts{Record: record(StateRunning, func(r *Record) { r.LeaseUntil = live }), Envelope: EnvelopeAbsent, Conflict: "actor"}),
			Action{Do: Conflict, Field: "actor"}},
		// A live lease.
		{"a live lease held by another worker: left until it ends",
			write(Facts{Record: record(StateRunning, func(r *Record) { r.LeaseUntil = live; r.Attempt = 1 }), Envelope: EnvelopeAbsent}),
			Action{Do: Wait, Delay: 10*time.Second + 50*time.Millisecond}},
		{"a live lease of a claim: left",
			write(Facts{Record: record(StateClaimed, func(r *Record) { r.LeaseUntil = live }), Envelope: EnvelopeAbsent}),
			Action{Do: Wait, Delay: 10*time.Second + 50*time.Millisecond}},
		{"a live lease with a cancel recorded: left to its owner, who reads the cancel",
			write(Facts{Record: record(StateRunning, func(r *Record) { r.LeaseUntil = live; r.CancelRequested = true }), Envelope: EnvelopeAbsent}),
			Action{Do: Wait, Delay: 10*time.Second + 50*time.Millisecond}},
		{"a lease that ends exactly now is over",
			write(Facts{Record: record(StateClaimed, func(r *Record) { r.LeaseUntil = now }), Envelope: EnvelopeAbsent}),
			Action{Do: Run, TakeOver: true}},
		// A cancel.
		{"a cancel's pending record: cancelled without the handler",
			write(Facts{Record: &Record{ExecutionID: "e1", State: StatePending, CancelRequested: true}, Envelope: EnvelopeAbsent}),
			Action{Do: Cancel, TakeOver: true}},
		{"a cancel on an expired running attempt: cancelled, its attempts reported, saying it may have taken effect",
			read(Facts{Record: record(StateRunning, func(r *Record) { r.Attempt = 1; r.CancelRequested = true }), Envelope: EnvelopeAbsent}),
			Action{Do: Cancel, TakeOver: true, Attempts: 1, Err: lostAttemptCancelled()}},
		{"a cancel beats the start deadline",
			write(Facts{Record: record(StateClaimed, func(r *Record) { r.CancelRequested = true }), Envelope: EnvelopeAbsent, StartDeadline: after}),
			Action{Do: Cancel, TakeOver: true}},
		// An expired claim: the handler never started.
		{"an expired claim: taken over and run",
			write(Facts{Record: record(StateClaimed, nil), Envelope: EnvelopeAbsent, StartDeadline: before}),
			Action{Do: Run, TakeOver: true}},
		{"an expired claim past the start deadline: NOT_STARTED",
			write(Facts{Record: record(StateClaimed, nil), Envelope: EnvelopeAbsent, StartDeadline: after}),
			Action{Do: NotStarted, TakeOver: true}},
		{"an expired claim of a capability no pool serves: CAPABILITY_NOT_FOUND",
			unknown(Facts{Record: record(StateClaimed, nil), Envelope: EnvelopeAbsent}),
			Action{Do: NotFound, TakeOver: true}},
		{"an expired claim marked WORKER_LOST, a write: OUTCOME_UNKNOWN, never from the top",
			write(Facts{Record: record(StateClaimed, func(r *Record) { r.LastError = envelope.CodeWorkerLost }), Envelope: EnvelopeAbsent}),
			Action{Do: Fail, TakeOver: true, AfterRun: true, Err: expiredRecord}},
		{"an expired claim marked WORKER_LOST, a read allowed a retry: run",
			read(Facts{Record: record(StateClaimed, func(r *Record) { r.LastError = envelope.CodeWorkerLost }), Envelope: EnvelopeAbsent, StartDeadline: before}),
			Action{Do: Run, TakeOver: true}},
		{"an expired claim marked WORKER_LOST, a read past the start deadline: OUTCOME_UNKNOWN",
			read(Facts{Record: record(StateClaimed, func(r *Record) { r.LastError = envelope.CodeWorkerLost }), Envelope: EnvelopeAbsent, StartDeadline: after}),
			Action{Do: Fail, TakeOver: true, AfterRun: true, Err: expiredRecord}},
		{"an expired claim marked WORKER_LOST of a capability no pool serves: OUTCOME_UNKNOWN",
			unknown(Facts{Record: record(StateClaimed, func(r *Record) { r.LastError = envelope.CodeWorkerLost }), Envelope: EnvelopeAbsent}),
			Action{Do: Fail, TakeOver: true, AfterRun: true, Err: expiredRecord}},
		// An expired attempt.
		{"an expired running attempt, eligible for a retry: attempt n+1",
			read(Facts{Record: record(StateRunning, attempt(1)), Envelope: EnvelopeAbsent, TTLDeadline: before}),
			Action{Do: Retry, TakeOver: true, Attempts: 2}},
		{"an expired backoff, eligible for a retry: attempt n+1",
			read(Facts{Record: record(StateBackoff, func(r *Record) { r.Attempt = 1; r.LastError = envelope.CodeTimeout }), Envelope: EnvelopeAbsent}),
			Action{Do: Retry, TakeOver: true, Attempts: 2}},
		{"an expired running attempt of a write: OUTCOME_UNKNOWN",
			write(Facts{Record: record(StateRunning, attempt(1)), Envelope: EnvelopeAbsent}),
			Action{Do: Fail, TakeOver: true, AfterRun: true, Attempts: 1, Err: lost}},
		{"an expired running attempt with no attempts left: OUTCOME_UNKNOWN",
			read(Facts{Record: record(StateRunning, attempt(2)), Envelope: EnvelopeAbsent}),
			Action{Do: Fail, TakeOver: true, AfterRun: true, Attempts: 2, Err: lost}},
		{"an expired running attempt, eligible, past the TTL deadline: OUTCOME_UNKNOWN, never retried",
			read(Facts{Record: record(StateRunning, attempt(1)), Envelope: EnvelopeAbsent, TTLDeadline: after}),
			Action{Do: Fail, TakeOver: true, AfterRun: true, Attempts: 1, Err: lost}},
		{"an expired running attempt, eligible, the start deadline passed: retried (a started execution is not bound by startBy)",
			read(Facts{Record: record(StateRunning, attempt(1)), Envelope: EnvelopeAbsent, StartDeadline: after, TTLDeadline: before}),
			Action{Do: Retry, TakeOver: true, Attempts: 2}},
		{"an expired running attempt of a capability no pool serves: OUTCOME_UNKNOWN",
			unknown(Facts{Record: record(StateRunning, attempt(1)), Envelope: EnvelopeAbsent}),
			Action{Do: Fail, TakeOver: true, AfterRun: true, Attempts: 1, Err: lost}},
		{"an expired backoff of a recorded failure, no retry allowed: the failure it recorded",
			write(Facts{Record: record(StateBackoff, func(r *Record) { r.Attempt = 1; r.LastError = envelope.CodeExecutionFailed }), Envelope: EnvelopeAbsent}),
			Action{Do: Fail, TakeOver: true, AfterRun: true, Attempts: 1, Err: &envelope.CapabilityError{Code: envelope.CodeExecutionFailed,
				Stage: envelope.StageHandler, Retryable: true, Message: "The operation failed."}}},
		{"an expired backoff of a timeout, no attempts left: the timeout, as the runtime stopping it",
			read(Facts{Record: record(StateBackoff, func(r *Record) { r.Attempt = 2; r.LastError = envelope.CodeTimeout }), Envelope: EnvelopeAbsent}),
			Action{Do: Fail, TakeOver: true, AfterRun: true, Attempts: 2, Err: timeoutError(5 * time.Second)}},
		{"an expired backoff of a timeout of a capability no pool serves: the recorded code",
			unknown(Facts{Record: record(StateBackoff, func(r *Record) { r.Attempt = 1; r.LastError = envelope.CodeTimeout }), Envelope: EnvelopeAbsent}),
			Action{Do: Fail, TakeOver: true, AfterRun: true, Attempts: 1, Err: &envelope.CapabilityError{Code: envelope.CodeTimeout,
				Stage: envelope.StageHandler, Retryable: true, Message: "The operation failed."}}},
		{"an expired backoff without its error: OUTCOME_UNKNOWN",
			write(Facts{Record: record(StateBackoff, attempt(1)), Envelope: EnvelopeAbsent}),
			Action{Do: Fail, TakeOver: true, AfterRun: true, Attempts: 1, Err: lost}},

		// Receipts (DESIGN §5): evidence the lost attempt recorded after its
		// effect.
		{"an expired running attempt with its receipt: completed from the receipt",
			write(Facts{Record: record(StateRunning, withReceipt(1)), Envelope: EnvelopeAbsent}),
			Action{Do: Recover, TakeOver: true, How: envelope.RecoveredByReceipt, Attempts: 1}},
		{"an expired running attempt with its receipt and a cancel: completed, the cancel came after the effect",
			write(Facts{Record: record(StateRunning, func(r *Record) { withReceipt(1)(r); r.CancelRequested = true }), Envelope: EnvelopeAbsent}),
			Action{Do: Recover, TakeOver: true, How: envelope.RecoveredByReceipt, Attempts: 1}},
		{"an expired running attempt with its receipt, a read allowed a retry: completed, not run again",
			read(Facts{Record: record(StateRunning, withReceipt(1)), Envelope: EnvelopeAbsent, TTLDeadline: before}),
			Action{Do: Recover, TakeOver: true, How: envelope.RecoveredByReceipt, Attempts: 1}},
		{"an expired running attempt with the receipt of an earlier attempt: as without one",
			write(Facts{Record: record(StateRunning, func(r *Record) { withReceipt(1)(r); r.Attempt = 2 }), Envelope: EnvelopeAbsent}),
			Action{Do: Fail, TakeOver: true, AfterRun: true, Attempts: 2, Err: lost}},
		{"an expired backoff with a receipt: the failure the handler returned decides",
			write(Facts{Record: record(StateBackoff, func(r *Record) { withReceipt(1)(r); r.LastError = envelope.CodeExecutionFailed }), Envelope: EnvelopeAbsent}),
			Action{Do: Fail, TakeOver: true, AfterRun: true, Attempts: 1, Err: &envelope.CapabilityError{Code: envelope.CodeExecutionFailed,
				Stage: envelope.StageHandler, Retryable: true, Message: "The operation failed."}}},
		{"an expired running attempt with its receipt, a capability no pool serves: OUTCOME_UNKNOWN (no one to make its output)",
			unknown(Facts{Record: record(StateRunning, withReceipt(1)), Envelope: EnvelopeAbsent}),
			Action{Do: Fail, TakeOver: true, AfterRun: true, Attempts: 1, Err: lost}},
		{"a live lease with a receipt: left to its owner",
			write(Facts{Record: record(StateRunning, func(r *Record) { withReceipt(1)(r); r.LeaseUntil = live }), Envelope: EnvelopeAbsent}),
			Action{Do: Wait, Delay: 10*time.Second + 50*time.Millisecond}},
		// Reconcilers: no receipt, the capability asks where the effect lives.
		{"an expired running attempt without a receipt, a reconciler: taken over as reconciling and asked",
			reconciling(Facts{Record: record(StateRunning, attempt(1)), Envelope: EnvelopeAbsent}),
			Action{Do: Reconcile, TakeOver: true, Attempts: 1}},
		{"an expired reconciliation (its worker lost while it asked): asked again",
			reconciling(Facts{Record: record(StateReconciling, func(r *Record) { r.Attempt, r.Reconciliations = 1, 1 }), Envelope: EnvelopeAbsent}),
			Action{Do: Reconcile, TakeOver: true, Attempts: 1}},
		{"an expired reconciliation lost three times: OUTCOME_UNKNOWN",
			reconciling(Facts{Record: record(StateReconciling, func(r *Record) { r.Attempt, r.Reconciliations = 1, 3 }), Envelope: EnvelopeAbsent}),
			Action{Do: Fail, TakeOver: true, AfterRun: true, Attempts: 1, Err: outcomeUnknown(reconciliationsLostMessage)}},
		{"an expired running attempt with a reconciler and a cancel: asked first (the cancel stopped nothing)",
			reconciling(Facts{Record: record(StateRunning, func(r *Record) { r.Attempt, r.CancelRequested = 1, true }), Envelope: EnvelopeAbsent}),
			Action{Do: Reconcile, TakeOver: true, Attempts: 1}},
		{"an expired reconciliation with a cancel: asked again",
			reconciling(Facts{Record: record(StateReconciling, func(r *Record) { r.Attempt, r.CancelRequested = 1, true }), Envelope: EnvelopeAbsent}),
			Action{Do: Reconcile, TakeOver: true, Attempts: 1}},
		{"an expired reconciliation lost three times, with a cancel: cancelled, saying it may have taken effect",
			reconciling(Facts{Record: record(StateReconciling, func(r *Record) { r.Attempt, r.Reconciliations, r.CancelRequested = 1, 3, true }), Envelope: EnvelopeAbsent}),
			Action{Do: Cancel, TakeOver: true, Attempts: 1, Err: lostAttemptCancelled()}},
		{"an expired running attempt with a reconciler and a cancel, a capability no pool serves: cancelled, never asked, saying it may have taken effect",
			unknown(Facts{Record: record(StateRunning, func(r *Record) { r.Attempt, r.CancelRequested = 1, true }), Envelope: EnvelopeAbsent, Recovery: Recovery{Reconciles: true}}),
			Action{Do: Cancel, TakeOver: true, Attempts: 1, Err: lostAttemptCancelled()}},
		{"an expired backoff with a reconciler and a cancel: cancelled, never asked (the attempt returned)",
			reconciling(Facts{Record: record(StateBackoff, func(r *Record) { r.Attempt, r.LastError, r.CancelRequested = 1, envelope.CodeExecutionFailed, true }), Envelope: EnvelopeAbsent}),
			Action{Do: Cancel, TakeOver: true, Attempts: 1}},
		{"an expired backoff with a reconciler: the failure the handler returned decides, never asked",
			reconciling(Facts{Record: record(StateBackoff, func(r *Record) { r.Attempt, r.LastError = 1, envelope.CodeExecutionFailed }), Envelope: EnvelopeAbsent}),
			Action{Do: Fail, TakeOver: true, AfterRun: true, Attempts: 1, Err: &envelope.CapabilityError{Code: envelope.CodeExecutionFailed,
				Stage: envelope.StageHandler, Retryable: true, Message: "The operation failed."}}},
		{"an expired running attempt with a reconciler, a capability no pool serves: OUTCOME_UNKNOWN, never asked",
			unknown(Facts{Record: record(StateRunning, attempt(1)), Envelope: EnvelopeAbsent, Recovery: Recovery{Reconciles: true}}),
			Action{Do: Fail, TakeOver: true, AfterRun: true, Attempts: 1, Err: lost}},
		{"the reconciler found the effect: completed from what it found",
			reconciling(asked(Found, Facts{Record: record(StateReconciling, attempt(1))})),
			Action{Do: Recover, How: envelope.RecoveredByReconciler, Attempts: 1}},
		{"the reconciler found the effect, a read allowed a retry: completed, not run again",
			read(asked(Found, Facts{Record: record(StateReconciling, attempt(1)), Recovery: Recovery{Reconciles: true}, TTLDeadline: before})),
			Action{Do: Recover, How: envelope.RecoveredByReconciler, Attempts: 1}},
		{"the reconciler proved the effect absent: attempt n+1 under the same key, audited as such",
			proving(asked(Absent, Facts{Record: record(StateReconciling, attempt(1)), TTLDeadline: before})),
			Action{Do: Retry, Attempts: 2, Reason: ReasonReconciledAbsent}},
		{"the reconciler proved the effect absent, no re-attempt left: failed, retryable (it never took effect)",
			proving(asked(Absent, Facts{Record: record(StateReconciling, func(r *Record) { r.Attempt, r.Reattempts = 3, 2 })})),
			Action{Do: Fail, AfterRun: true, Attempts: 3, Err: absentError()}},
		{"the reconciler proved the effect absent past the TTL deadline: failed, retryable, never run again",
			proving(asked(Absent, Facts{Record: record(StateReconciling, attempt(1)), TTLDeadline: after})),
			Action{Do: Fail, AfterRun: true, Attempts: 1, Err: absentError()}},
		{"the reconciler said absent but cannot prove it, a write: OUTCOME_UNKNOWN, never run again",
			reconciling(asked(Absent, Facts{Record: record(StateReconciling, attempt(1)), TTLDeadline: before})),
			Action{Do: Fail, AfterRun: true, Attempts: 1, Err: outcomeUnknown(inconclusiveMessage)}},
		{"the reconciler could not tell, a write: OUTCOME_UNKNOWN",
			proving(asked(Inconclusive, Facts{Record: record(StateReconciling, attempt(1)), TTLDeadline: before})),
			Action{Do: Fail, AfterRun: true, Attempts: 1, Err: outcomeUnknown(inconclusiveMessage)}},
		{"the reconciler could not tell, a read allowed a retry: attempt n+1 by the retry rule",
			read(asked(Inconclusive, Facts{Record: record(StateReconciling, attempt(1)), Recovery: Recovery{Reconciles: true}, TTLDeadline: before})),
			Action{Do: Retry, Attempts: 2}},
		{"a cancel recorded while the reconciler asked, which found the effect: completed, the cancel came after it",
			reconciling(asked(Found, Facts{Record: record(StateReconciling, func(r *Record) { r.Attempt, r.CancelRequested = 1, true })})),
			Action{Do: Recover, How: envelope.RecoveredByReconciler, Attempts: 1}},
		{"a cancel recorded while the reconciler asked, which proved absence: cancelled, never run again",
			proving(asked(Absent, Facts{Record: record(StateReconciling, func(r *Record) { r.Attempt, r.CancelRequested = 1, true })})),
			Action{Do: Cancel, Attempts: 1}},
		{"a cancel recorded while the reconciler asked, which said absent without the proof: cancelled, saying it may have taken effect",
			reconciling(asked(Absent, Facts{Record: record(StateReconciling, func(r *Record) { r.Attempt, r.CancelRequested = 1, true })})),
			Action{Do: Cancel, Attempts: 1, Err: lostAttemptCancelled()}},
		{"a cancel recorded while the reconciler asked, which could not tell: cancelled, saying it may have taken effect",
			proving(asked(Inconclusive, Facts{Record: record(StateReconciling, func(r *Record) { r.Attempt, r.CancelRequested = 1, true })})),
			Action{Do: Cancel, Attempts: 1, Err: lostAttemptCancelled()}},

		// No record, before any claim.
		{"no record, which proves nothing started, past the start deadline: NOT_STARTED before any claim",
			write(Facts{AbsenceProves: true, StartDeadline: after}),
			Action{Do: EndNotStarted}},
		{"no record, which proves nothing started, before the start deadline: claim",
			write(Facts{AbsenceProves: true, StartDeadline: before}),
			Action{Do: Claim}},
		{"no record, which proves nothing, past the start deadline: claim, and the claiming path decides",
			write(Facts{AbsenceProves: false, StartDeadline: after}),
			Action{Do: Claim}},
		{"no record, no deadline known: claim",
			write(Facts{AbsenceProves: true}),
			Action{Do: Claim}},
		// No record, this delivery's claim made.
		{"a claim of a recent id's first delivery: run without reading the envelope",
			write(Facts{Claimed: true, FirstRecent: true, AbsenceProves: true}),
			Action{Do: Run}},
		{"a claim where an envelope is found: a duplicate",
			write(Facts{Claimed: true, Envelope: EnvelopePresent, AbsenceProves: true}),
			Action{Do: Duplicate}},
		{"a claim where an undecodable envelope is found: a duplicate",
			write(Facts{Claimed: true, Envelope: EnvelopeUndecodable, AbsenceProves: true}),
			Action{Do: Duplicate}},
		{"a claim where the envelope could not be read: wait (the claim is released)",
			write(Facts{Claimed: true, Envelope: EnvelopeUnknown, AbsenceProves: true}),
			Action{Do: Wait, Delay: time.Second}},
		{"a claim of an id older than envelopes are kept: refused, never run",
			write(Facts{Claimed: true, Envelope: EnvelopeAbsent, AbsenceProves: true, IDExpired: func() bool { return true }}),
			Action{Do: RefuseExpired}},
		{"a claim where the missing record proves nothing, a write: OUTCOME_UNKNOWN",
			write(Facts{Claimed: true, Envelope: EnvelopeAbsent, AbsenceProves: false}),
			Action{Do: Fail, AfterRun: true, Err: expiredRecord}},
		{"a claim where the missing record proves nothing, a read allowed a retry: run",
			read(Facts{Claimed: true, Envelope: EnvelopeAbsent, AbsenceProves: false, StartDeadline: before}),
			Action{Do: Run}},
		{"a claim where the missing record proves nothing, a read past its start deadline: OUTCOME_UNKNOWN",
			read(Facts{Claimed: true, Envelope: EnvelopeAbsent, AbsenceProves: false, StartDeadline: after}),
			Action{Do: Fail, AfterRun: true, Err: expiredRecord}},
		{"a claim where the missing record proves nothing, a capability no pool serves: OUTCOME_UNKNOWN",
			unknown(Facts{Claimed: true, Envelope: EnvelopeAbsent, AbsenceProves: false}),
			Action{Do: Fail, AfterRun: true, Err: expiredRecord}},
		{"a claim where the missing record proves that nothing started: run",
			write(Facts{Claimed: true, Envelope: EnvelopeAbsent, AbsenceProves: true}),
			Action{Do: Run}},
		{"a claim where the missing record proves that nothing started, a capability no pool serves: run (CAPABILITY_NOT_FOUND)",
			unknown(Facts{Claimed: true, Envelope: EnvelopeAbsent, AbsenceProves: true}),
			Action{Do: Run}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.f.Now = now
			got := Takeover(tc.f)
			if !sameAction(got, tc.want) {
				t.Errorf("Takeover = %s, want %s", describe(got), describe(tc.want))
			}
		})
	}
}

// A cancel recorded between the read of a record and the takeover's
// compare-and-swap is read in the record the swap wrote: it ends the
// execution, whatever the table had decided from the record before.
func TestTakeover_CancelRecordedMeanwhileWins(t *testing.T) {
	t.Parallel()
	taken := &Record{State: StateRunning, Attempt: 2, CancelRequested: true}
	for _, a := range []Action{
		{Do: Run, TakeOver: true},
		{Do: Retry, TakeOver: true, Attempts: 3},
		{Do: NotStarted, TakeOver: true},
		{Do: Fail, TakeOver: true, Attempts: 2, Err: outcomeUnknown(lostWorkerMessage)},
	} {
		if got, want := a.AfterTakeover(taken), (Action{Do: Cancel, TakeOver: true, Attempts: 2, Err: lostAttemptCancelled()}); !sameAction(got, want) {
			t.Errorf("%s after a cancel: %s, want %s", a.Do, describe(got), describe(want))
		}
		if got := a.AfterTakeover(&Record{State: StateRunning, Attempt: 2}); !sameAction(got, a) {
			t.Errorf("%s without a cancel: %s, want it unchanged", a.Do, describe(got))
		}
	}
	// A receipt the lost attempt recorded says its effect happened: the
	// cancel came too late to stop it. A reconciler to ask whether it did
	// is asked: its answer decides with the cancel.
	for _, a := range []Action{
		{Do: Recover, TakeOver: true, How: envelope.RecoveredByReceipt, Attempts: 2},
		{Do: Reconcile, TakeOver: true, Attempts: 2},
	} {
		if got := a.AfterTakeover(taken); !sameAction(got, a) {
			t.Errorf("%s after a cancel: %s, want it unchanged", a.Do, describe(got))
		}
	}
}

// The retry rule may run a capability's RetryOn: the table asks it only in
// the rows that depend on it (a lost attempt, a claim whose missing record
// proved nothing), never to tell a duplicate, a live lease or a cancel.
func TestTakeover_RetryRuleAskedOnlyWhereARowNeedsIt(t *testing.T) {
	t.Parallel()
	now := time.Now()
	for _, tc := range []struct {
		name string
		f    Facts
		asks bool
	}{
		{"an envelope", Facts{Record: &Record{State: StateRunning, Attempt: 1}, Envelope: EnvelopePresent}, false},
		{"a live lease", Facts{Record: &Record{State: StateRunning, Worker: "w", LeaseUntil: now.Add(time.Minute)}, Envelope: EnvelopeAbsent}, false},
		{"a cancel", Facts{Record: &Record{State: StateRunning, CancelRequested: true}, Envelope: EnvelopeAbsent}, false},
		{"an expired claim", Facts{Record: &Record{State: StateClaimed}, Envelope: EnvelopeAbsent}, false},
		{"a recent first delivery", Facts{Claimed: true, FirstRecent: true}, false},
		{"a claim where the missing record proves it new", Facts{Claimed: true, Envelope: EnvelopeAbsent, AbsenceProves: true}, false},
		{"a lost attempt", Facts{Record: &Record{State: StateRunning, Attempt: 1}, Envelope: EnvelopeAbsent}, true},
		{"a lost claim marked WORKER_LOST", Facts{Record: &Record{State: StateClaimed, LastError: envelope.CodeWorkerLost}, Envelope: EnvelopeAbsent}, true},
		{"a claim where the missing record proves nothing", Facts{Claimed: true, Envelope: EnvelopeAbsent}, true},
	} {
		asked := false
		tc.f.Known, tc.f.Now = true, now
		tc.f.Retry = func(int) bool { asked = true; return false }
		Takeover(tc.f)
		if asked != tc.asks {
			t.Errorf("%s: retry rule asked %v, want %v", tc.name, asked, tc.asks)
		}
	}
}

// lostAttemptCancelled is the error of a cancel of an attempt that was
// running when its worker was lost.
func lostAttemptCancelled() *envelope.CapabilityError {
	return &envelope.CapabilityError{Code: envelope.CodeCancelled, Stage: envelope.StageCancelation, ExposeToModel: true,
		Message: "The caller cancelled the execution after its attempt had started on a worker that was lost: the attempt may have taken effect."}
}

func sameAction(a, b Action) bool {
	if a.Do != b.Do || a.TakeOver != b.TakeOver || a.Delay != b.Delay || a.Field != b.Field || a.Attempts != b.Attempts ||
		a.AfterRun != b.AfterRun || a.How != b.How || a.Reason != b.Reason || (a.Err == nil) != (b.Err == nil) {
		return false
	}
	if a.Err == nil {
		return true
	}
	return a.Err.Code == b.Err.Code && a.Err.Stage == b.Err.Stage && a.Err.Message == b.Err.Message &&
		a.Err.Retryable == b.Err.Retryable && a.Err.ExposeToModel == b.Err.ExposeToModel
}

func describe(a Action) string {
	s := a.Do.String()
	if a.TakeOver {
		s = "take over, " + s
	}
	if a.Delay > 0 {
		s += " " + a.Delay.String()
	}
	if a.Field != "" {
		s += " " + a.Field
	}
	if a.Attempts > 0 {
		s += fmt.Sprintf(" attempts=%d", a.Attempts)
	}
	if a.How != "" || a.Reason != "" {
		s += " " + a.How + a.Reason
	}
	if a.Err != nil {
		s += " " + string(a.Err.Code) + "/" + a.Err.Stage + " " + a.Err.Message
	}
	return s
}
