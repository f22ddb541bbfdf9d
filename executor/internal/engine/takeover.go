package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/capstan-dev/capstan/envelope"
)

// DESIGN §13: every request ends. A request carries when it must have started
// (startBy, set by its client); a request no worker started by then ends
// failed / NOT_STARTED. The record TTL bounds it too: the exec stream drops a
// request at the record TTL (MaxAge), and a request is never claimed from
// scratch within ttlMargin of it. (A record itself goes one record window
// after its last write; a redelivery that finds none decides as the rows of
// a missing record say, once it holds its own claim: Facts.Claimed.) The
// check is a comparison on the delivery; the sweeper (package sweeper) ends
// the requests no worker is given.

// The takeover table of DESIGN §5, as one pure function: what a delivery
// does, given the record and the envelope it found, what it knows of its own
// request, and the time. Every row of the table is one case below and one row
// of TestTakeover (takeover_test.go); the engine only gathers the facts and
// carries the action out (delivery.apply).

// EnvelopeRead is what a read of an execution's envelope found.
type EnvelopeRead int

// What a read of the envelope can find.
const (
	// EnvelopeNotRead: the delivery did not need to read it (a recent id's
	// first delivery: any earlier execution of the id still has its record).
	EnvelopeNotRead EnvelopeRead = iota
	// EnvelopeAbsent: the store says there is none.
	EnvelopeAbsent
	// EnvelopePresent: the execution has ended.
	EnvelopePresent
	// EnvelopeUndecodable: something is stored there, whatever it holds:
	// only a finalization writes there, so the execution has ended.
	EnvelopeUndecodable
	// EnvelopeUnknown: the store did not answer. Unknown is not absent: a
	// takeover now could repeat a finished attempt.
	EnvelopeUnknown
)

// classifyEnvelope is what a read of an envelope that returned env and err
// found: an envelope there, whatever it holds, is the end; a read that
// failed is unknown, never absent.
func classifyEnvelope(env *envelope.Envelope, err error) EnvelopeRead {
	switch {
	case errors.Is(err, envelope.ErrDecode):
		return EnvelopeUndecodable
	case err != nil:
		return EnvelopeUnknown
	case env != nil:
		return EnvelopePresent
	}
	return EnvelopeAbsent
}

// Delivery is what a delivery's metadata tells the rules: when its request
// was stored, and how many times JetStream has delivered it. Zero: nothing
// known (a request with no delivery, or metadata that did not parse).
type Delivery struct {
	ID         string
	StartBy    *time.Time
	Stored     time.Time
	Deliveries int
}

// Windows are the durations the rules read, the deployment's (DESIGN §13,
// §16).
type Windows struct {
	// Record is how long a record outlives its last write.
	Record time.Duration
	// Recent is how recent an id must be for the short path: the record
	// window, or less when envelopes are kept for less.
	Recent time.Duration
	// TTL is the record TTL, the exec stream's MaxAge.
	TTL time.Duration
}

// facts are what a delivery's metadata gives the table at now: its
// deadlines, what a missing record proves, whether it is a recent id's
// first delivery. Without metadata nothing is proven and no deadline is
// known.
func (d Delivery) facts(w Windows, now time.Time) Facts {
	f := Facts{Now: now}
	if d.Stored.IsZero() {
		return f
	}
	f.StartDeadline = StartDeadline(d.Stored, d.StartBy, w.TTL)
	f.TTLDeadline = TTLDeadline(d.Stored, w.TTL)
	f.AbsenceProves = AbsenceProves(d.ID, d.Stored, d.Deliveries == 1, now, w.Record)
	f.FirstRecent = d.Deliveries == 1 && recentID(d.ID, now, w.Recent)
	return f
}

// Facts is what the takeover table decides from.
type Facts struct {
	// Record is the execution's record as found, nil when there was none.
	// With Claimed, nil means that this delivery found none and has just
	// created its own claim.
	Record *Record
	// Claimed: this delivery holds its own claim on the execution (created
	// where no record was).
	Claimed bool
	// Envelope is what a read of the envelope found.
	Envelope EnvelopeRead
	// Conflict names the field in which the request differs from the one
	// the record was claimed for ("" when it is that request; Record.Conflict).
	Conflict string
	// Known: this worker serves the request's capability.
	Known bool
	// Timeout is the capability's attempt timeout (when Known), for the
	// error of a timed-out attempt whose retry was lost.
	Timeout time.Duration
	// Retry reports whether the capability allows another attempt after
	// attempt n was lost with its worker (SI-11 and the attempts it has
	// left); nil allows none. Asked only where a row needs it: it may call a
	// capability's RetryOn.
	Retry func(n int) bool
	// AbsenceProves: finding no record proves that no attempt of the
	// execution started (AbsenceProves).
	AbsenceProves bool
	// FirstRecent: the request's first delivery, its id made within the
	// record window: any earlier execution of the id would have its record.
	FirstRecent bool
	// IDExpired reports whether the request's id is older than envelopes are
	// kept (an envelope of it would be gone); nil: never. Asked only where a
	// row needs it.
	IDExpired func() bool
	// StartDeadline is when the request must have started, TTLDeadline when
	// nothing may start or retry it any more (DESIGN §13); zero: none known.
	StartDeadline, TTLDeadline time.Time
	// Now is the time of the decision.
	Now time.Time
	// Recovery is what the capability declares for a lost attempt (when
	// Known): its reconciler, whether it proves absence, the attempts a
	// proof may start.
	Recovery Recovery
	// Reconciled is the reconciler's answer about the record's attempt, once
	// this delivery asked it (then Claimed is set: it holds the record).
	Reconciled Verdict
}

// Do is what the takeover table says to do.
type Do int

// The actions of the takeover table.
const (
	// Claim: no record and nothing against one: claim the execution (the
	// engine chooses the short or the claiming path) and run it.
	Claim Do = iota + 1
	// EndNotStarted: no record where that proves that nothing started, past
	// the start deadline: end it NOT_STARTED before any claim (a finalized
	// record, then its envelope).
	EndNotStarted
	// Duplicate: the execution has ended: acknowledge, audit
	// execution.duplicate_delivery, never a new attempt.
	Duplicate
	// RestoreEnvelope: a finalized record without its envelope: write the
	// envelope the record stands for, then as Duplicate.
	RestoreEnvelope
	// Conflict: the record was claimed for another request under the same
	// id: acknowledge without running it, audit the conflict.
	Conflict
	// Wait: leave the delivery for a later one (NAK after Delay; a claim this
	// delivery holds is released).
	Wait
	// RefuseExpired: the id is older than envelopes are kept: terminate the
	// request without an envelope (DESIGN §16).
	RefuseExpired
	// Run: run the execution from stage 2 (a fresh claim) or from the top of
	// the stages (a takeover of a claim whose handler never started).
	Run
	// Retry: a takeover runs attempt Attempts after the lost one.
	Retry
	// Cancel: finalize cancelled / CANCELLED without calling the handler.
	Cancel
	// NotFound: finalize CAPABILITY_NOT_FOUND: no pool serves it.
	NotFound
	// NotStarted: finalize failed / NOT_STARTED: past the start deadline.
	NotStarted
	// Fail: finalize failed with Err, after a run (Err says how).
	Fail
	// Recover: finalize completed from what attempt Attempts left — its
	// receipt, or what the reconciler found (How).
	Recover
	// Reconcile: hold the record as reconciling{Attempts} and ask the
	// capability's reconciler whether the attempt took effect; its answer
	// decides again (Facts.Reconciled).
	Reconcile

	// The engine's own steps, which no row of the table returns: what a
	// delivery's steps decide on the way (the stages, the limits, the
	// attempts), carried out in the same place as the table's actions.

	// Finish: finalize with the outcome a step reached (an attempt's output
	// or failure, a refusal of the stages or a limit, a cancel seen).
	Finish
	// AwaitApproval: the stages, or a budget, need an approval: claim,
	// reserve its id on the record, store it, finalize approval-required.
	AwaitApproval
	// Release: give the execution back at once (the worker shuts down): its
	// lease ends now and the delivery comes back at once.
	Release
	// Refuse: end a request that must never run (one that does not decode,
	// whose message id names another execution, a resume refused before it
	// is resolved) with Err, unrun, and settle the delivery once its
	// envelope exists.
	Refuse
)

var doNames = [...]string{"", "claim", "end-not-started", "duplicate", "restore-envelope", "conflict", "wait",
	"refuse-expired", "run", "retry", "cancel", "not-found", "not-started", "fail", "recover", "reconcile",
	"finish", "await-approval", "release", "refuse"}

// String names the action, for logs and test failures.
func (d Do) String() string {
	if d > 0 && int(d) < len(doNames) {
		return doNames[d]
	}
	return "?"
}

// Action is one decision of the takeover table.
type Action struct {
	Do Do
	// TakeOver: the record is another claim's whose lease ran out: the
	// engine takes it by compare-and-swap before it does the rest.
	TakeOver bool
	// Delay is Wait's.
	Delay time.Duration
	// Field is Conflict's.
	Field string
	// Attempts is the attempt Retry runs, or the attempts a finalization
	// reports.
	Attempts int
	// Err is Fail's error; AfterRun says whether the handler may have run
	// (the event's executedBeforeFailure, and a timeout's status).
	Err      *envelope.CapabilityError
	AfterRun bool
	// How is what Recover recovers from (envelope.RecoveredByReceipt,
	// envelope.RecoveredByReconciler).
	How string
	// Reason is why Retry runs another attempt when the retry rule is not
	// what allows it (ReasonReconciledAbsent), and Refuse's reason on the
	// trail.
	Reason string

	// What the engine's own steps carry.
	end   *outcome        // Finish's
	need  *ApprovalNeeded // AwaitApproval's
	limit bool            // Wait's: for a limit (the record names no worker meanwhile)
	term  string          // Refuse's: the delivery is terminated with this reason ("": acknowledged)
}

// ReasonReconciledAbsent is the reason of an attempt started because the
// capability's reconciler proved the effect of the lost one absent.
const ReasonReconciledAbsent = "reconciled-absent"

// maxReconciliations bounds the reconciliations of one attempt lost with
// their workers: a reconciler that kills its worker every time ends the
// execution OUTCOME_UNKNOWN instead of taking every worker down.
const maxReconciliations = 3

// Messages of the OUTCOME_UNKNOWN the table decides.
const (
	// lostWorkerMessage: an attempt started and its worker was lost.
	lostWorkerMessage = "The worker running this operation was lost; it may or may not have taken effect."
	// expiredRecordMessage: an execution whose record may have expired
	// under an attempt.
	expiredRecordMessage = "An earlier delivery of this operation may have run it under a record that has expired since; it may or may not have taken effect."
	// inconclusiveMessage: the reconciler could not tell whether the lost
	// attempt took effect.
	inconclusiveMessage = "The worker running this operation was lost, and the system where its effect lives could not tell whether it took effect; it may or may not have."
	// reconciliationsLostMessage: the reconciliations of a lost attempt
	// were lost with their workers too.
	reconciliationsLostMessage = "The worker running this operation was lost, and so were the workers asking whether it took effect; it may or may not have."
	// absentMessage: the reconciler proved that the lost attempt did not
	// take effect, and no other attempt may start.
	absentMessage = "The operation did not take effect: its worker was lost before it did, as the system where its effect lives confirms. It was not run again; calling it again is safe."
)

// Takeover is the takeover table of DESIGN §5.
func Takeover(f Facts) Action {
	if f.Record == nil {
		return noRecord(f)
	}
	rec := f.Record
	if f.Claimed {
		// This delivery took the record over and holds it: the
		// reconciler's answer decides.
		return taken(rec, f)
	}
	switch {
	case f.Envelope == EnvelopeUndecodable:
		// An envelope is there, whatever it holds: never a new attempt.
		return Action{Do: Duplicate}
	case f.Envelope == EnvelopeUnknown:
		return Action{Do: Wait, Delay: time.Second}
	case f.Envelope != EnvelopePresent && rec.State == StateFinalized:
		// A finalized record stands for its envelope.
		return Action{Do: RestoreEnvelope}
	case f.Envelope == EnvelopePresent:
		// The envelope is the proof: the record is left as it is.
		return Action{Do: Duplicate}
	case f.Conflict != "":
		return Action{Do: Conflict, Field: f.Conflict}
	case rec.Leased(f.Now) && rec.State != StatePending:
		// Another claim's, whichever worker id it names: two processes may
		// share one. A claim of this worker whose answer was lost is waited
		// out too.
		return Action{Do: Wait, Delay: rec.LeaseUntil.Sub(f.Now) + 50*time.Millisecond}
	}
	a := taken(rec, f)
	a.TakeOver = true
	return a
}

// taken is what a takeover does with the record it takes: the rows of an
// expired lease, a cancel, a pending record.
func taken(rec *Record, f Facts) Action {
	// Evidence that the lost attempt's effect happened decides first:
	// whatever else the record says (a cancel came too late to stop it), it
	// completed.
	switch {
	case lostReceipt(rec) != nil && f.Known:
		return Action{Do: Recover, How: envelope.RecoveredByReceipt, Attempts: rec.Attempt}
	case f.Reconciled == Found && f.Known && f.Recovery.Reconciles:
		return Action{Do: Recover, How: envelope.RecoveredByReconciler, Attempts: rec.Attempt}
	}
	if rec.CancelRequested {
		// A cancel stops nothing of an attempt lost with its worker: a
		// reconciler is asked first whether it took effect.
		if lostAttempt(rec) && f.Known && f.Recovery.Reconciles && f.Reconciled == NotAsked &&
			rec.Reconciliations < maxReconciliations {
			return Action{Do: Reconcile, Attempts: rec.Attempt}
		}
		return cancelAction(rec, !f.provedAbsent())
	}
	switch rec.State {
	case StateRunning, StateBackoff, StateReconciling:
		n := rec.Attempt
		if rec.State != StateBackoff && f.Known && f.Recovery.Reconciles {
			if a, ok := reconciled(rec, f); ok {
				return a
			}
		}
		// Past the TTL deadline nothing starts another attempt: its record
		// would not outlive the request. Without the capability here,
		// nothing may run it again either.
		if f.Known && f.retry(n) && !passed(f.TTLDeadline, f.Now) {
			return Action{Do: Retry, Attempts: n + 1}
		}
		if rec.State == StateBackoff && rec.LastError != "" {
			// The attempt failed and was recorded; only its retry was lost.
			last := &envelope.CapabilityError{Code: rec.LastError, Stage: envelope.StageHandler, Retryable: true,
				Message: "The operation failed."}
			if last.Code == envelope.CodeTimeout && f.Known {
				last = timeoutError(f.Timeout)
			}
			return Action{Do: Fail, Attempts: n, AfterRun: true, Err: last}
		}
		if f.Reconciled != NotAsked {
			return Action{Do: Fail, Attempts: n, AfterRun: true, Err: outcomeUnknown(inconclusiveMessage)}
		}
		return Action{Do: Fail, Attempts: n, AfterRun: true, Err: outcomeUnknown(lostWorkerMessage)}
	}
	// The handler never started (pending, claimed): run from the top, unless
	// the request's start deadline has passed. A claim made where no record
	// proved that no attempt had run is marked WORKER_LOST: it decides as
	// that claim would have (a missing record that proves nothing).
	if rec.State == StateClaimed && rec.LastError == envelope.CodeWorkerLost && !f.mayRunAgain() {
		return Action{Do: Fail, AfterRun: true, Err: outcomeUnknown(expiredRecordMessage)}
	}
	switch {
	case passed(f.StartDeadline, f.Now):
		return Action{Do: NotStarted}
	case !f.Known:
		return Action{Do: NotFound}
	}
	return Action{Do: Run}
}

// reconciled is the table's rows for a lost attempt of a capability with a
// reconciler: ask it (once the takeover holds the record), then act on its
// answer. ok is false where the answer proves nothing: the rows of a lost
// attempt without a reconciler decide (a retry where the rule allows one,
// OUTCOME_UNKNOWN otherwise). A new attempt of work the retry rule does not
// allow runs only on a proof of absence (DESIGN §5, rule A).
func reconciled(rec *Record, f Facts) (a Action, ok bool) {
	n := rec.Attempt
	switch f.Reconciled {
	case NotAsked:
		if rec.State == StateReconciling && rec.Reconciliations >= maxReconciliations {
			return Action{Do: Fail, Attempts: n, AfterRun: true, Err: outcomeUnknown(reconciliationsLostMessage)}, true
		}
		return Action{Do: Reconcile, Attempts: n}, true
	case Absent:
		if !f.Recovery.ProvesAbsence {
			return Action{}, false
		}
		if rec.Reattempts >= f.Recovery.MaxReattempts || passed(f.TTLDeadline, f.Now) {
			return Action{Do: Fail, Attempts: n, AfterRun: true, Err: absentError()}, true
		}
		return Action{Do: Retry, Attempts: n + 1, Reason: ReasonReconciledAbsent}, true
	}
	return Action{}, false
}

// noRecord is the table's rows for a delivery that found no record: before
// its claim, and once the claiming path has created it (Claimed).
func noRecord(f Facts) Action {
	if !f.Claimed {
		if f.AbsenceProves && passed(f.StartDeadline, f.Now) {
			return Action{Do: EndNotStarted}
		}
		return Action{Do: Claim}
	}
	if f.FirstRecent {
		return Action{Do: Run}
	}
	switch f.Envelope {
	case EnvelopePresent, EnvelopeUndecodable:
		return Action{Do: Duplicate}
	case EnvelopeUnknown, EnvelopeNotRead:
		return Action{Do: Wait, Delay: time.Second}
	}
	if f.IDExpired != nil && f.IDExpired() {
		// Any envelope of this id would be gone: it cannot be told from one
		// that ran. Refused, never run (DESIGN §16).
		return Action{Do: RefuseExpired}
	}
	if !f.AbsenceProves && !f.mayRunAgain() {
		// An earlier delivery may have run an attempt under a record that
		// has expired since.
		return Action{Do: Fail, AfterRun: true, Err: outcomeUnknown(expiredRecordMessage)}
	}
	return Action{Do: Run}
}

// AfterTakeover is the action once the takeover's compare-and-swap holds
// taken, the record as written: a cancel recorded meanwhile ends it, unless
// the lost attempt's receipt says its effect happened or its reconciler is
// to be asked whether it did (the answer decides with the cancel).
func (a Action) AfterTakeover(taken *Record) Action {
	if taken.CancelRequested && a.Do != Cancel && a.Do != Recover && a.Do != Reconcile {
		c := cancelAction(taken, true)
		c.TakeOver = true
		return c
	}
	return a
}

// cancelAction is the end of rec's execution by its caller's cancel. Of an
// attempt that was running when its worker was lost, unless a reconciler
// proved its effect absent (mayHaveRun false), the envelope says the effect
// may have happened: the cancel stopped nothing.
func cancelAction(rec *Record, mayHaveRun bool) Action {
	a := Action{Do: Cancel, Attempts: rec.Attempt}
	if mayHaveRun && lostAttempt(rec) {
		a.Err = &envelope.CapabilityError{Code: envelope.CodeCancelled, Stage: envelope.StageCancelation, ExposeToModel: true,
			Message: "The caller cancelled the execution after its attempt had started on a worker that was lost: the attempt may have taken effect."}
	}
	return a
}

// lostAttempt reports whether rec holds an attempt that may have been
// running when its worker was lost: started and not returned.
func lostAttempt(rec *Record) bool {
	return rec.State == StateRunning || rec.State == StateReconciling
}

// provedAbsent reports whether the reconciler proved that the lost attempt
// did not take effect: it answered absent and declares the proof.
func (f Facts) provedAbsent() bool { return f.Reconciled == Absent && f.Recovery.ProvesAbsence }

func (f Facts) retry(n int) bool { return f.Retry != nil && f.Retry(n) }

// mayRunAgain reports whether an execution whose attempt may have run
// unrecorded may run now: only a capability eligible for a retry after a
// lost worker, and never past the start deadline.
func (f Facts) mayRunAgain() bool {
	return f.Known && f.retry(0) && !passed(f.StartDeadline, f.Now)
}

// passed reports whether deadline d (zero: none) has passed at now.
func passed(d, now time.Time) bool { return !d.IsZero() && now.After(d) }

// LostWorkerError is the OUTCOME_UNKNOWN of an attempt that started and
// whose worker was lost.
func LostWorkerError() *envelope.CapabilityError { return outcomeUnknown(lostWorkerMessage) }

// ExpiredRecordError is the OUTCOME_UNKNOWN of an execution whose record may
// have expired under an attempt: it is never said to have not started.
func ExpiredRecordError() *envelope.CapabilityError { return outcomeUnknown(expiredRecordMessage) }

// absentError is the failure of an execution whose lost attempt a
// reconciler proved never took effect, when no other attempt may start:
// retryable, for the caller may safely call again.
func absentError() *envelope.CapabilityError {
	return &envelope.CapabilityError{Code: envelope.CodeExecutionFailed, Stage: envelope.StageHandler, Retryable: true,
		ExposeToModel: true, Message: absentMessage}
}

// timeoutError is the error of an attempt that did not finish within d.
func timeoutError(d time.Duration) *envelope.CapabilityError {
	return &envelope.CapabilityError{Code: envelope.CodeTimeout, Stage: envelope.StageTimeout, Retryable: true, ExposeToModel: true,
		Message: fmt.Sprintf("The operation did not finish within %v.", d), Cause: context.DeadlineExceeded}
}

// outcomeUnknown is the error of an attempt whose outcome was lost.
func outcomeUnknown(msg string) *envelope.CapabilityError {
	return &envelope.CapabilityError{Code: envelope.CodeOutcomeUnknown, Stage: envelope.StageHandler, ExposeToModel: true,
		Message: msg}
}

// ttlMargin is how long before the record TTL a request stops being started.
func ttlMargin(ttl time.Duration) time.Duration { return min(ttl/10, time.Hour) }

// StartDeadline is when a request stored at stored must have started: its
// startBy, and at the latest ttlMargin before its age reaches the record
// TTL.
func StartDeadline(stored time.Time, startBy *time.Time, recordTTL time.Duration) time.Time {
	d := TTLDeadline(stored, recordTTL)
	if startBy != nil && startBy.Before(d) {
		d = *startBy
	}
	return d
}

// TTLDeadline is when a request stored at stored must end: past it,
// nothing may start or retry it, and the sweeper finalizes what is left.
func TTLDeadline(stored time.Time, recordTTL time.Duration) time.Time {
	return stored.Add(recordTTL - ttlMargin(recordTTL))
}

// idSkew is how far a client's or the server's clock may be from the
// worker's for an id's time, or a message's, to be trusted: a minute, or a
// quarter of a record window shorter than four minutes (tests).
func idSkew(window time.Duration) time.Duration { return min(time.Minute, window/4) }

// recentID reports whether id is a UUIDv7 made within window of now (less
// the skew a client's clock may have): then any earlier execution of the id
// still has its record.
func recentID(id string, now time.Time, window time.Duration) bool {
	made, ok := envelope.ExecutionIDTime(id)
	if !ok {
		return false
	}
	skew := idSkew(window)
	return made.After(now.Add(-window+skew)) && made.Before(now.Add(skew))
}

// AbsenceProves reports whether finding no record of an execution proves
// that no claim of it was ever made, so that no attempt of it started. A
// record goes one record window after its last write (DESIGN §16): once a
// claim could have been made longer ago than that, its absence proves
// nothing by itself. A claim of an id comes after a message of it was
// stored, and the claims of one message after that message was stored. So
// the absence proves it when the id was made within the window (less the
// clock skew), or when the message is the id's first publication (stored
// within the skew of the id's time; an id that is no UUIDv7 is taken for
// one) and was either never delivered before (firstDelivery) or stored
// within the window. A later publication of the id (a producer's retry past
// the duplicate window, a forward from _unrouted) proves nothing once the
// id is older than the window: an earlier one may have run. The id's age
// alone would not do: the first delivery of a request that waited in a
// backlog longer than the window must still run. Nor would keeping every
// unfinished record until the request's own TTL: that costs one more write
// per execution, after its envelope, and leaves the records of crashed
// workers for days; this rule costs no write.
func AbsenceProves(id string, stored time.Time, firstDelivery bool, now time.Time, window time.Duration) bool {
	if recentID(id, now, window) {
		return true
	}
	if laterPublication(id, stored, window) {
		return false
	}
	return firstDelivery || now.Sub(stored) < window-idSkew(window)
}

// laterPublication reports whether a message stored at stored is not the
// first publication of id: stored later than the skew after the id's time
// (a producer's retry past the duplicate window, a forward from _unrouted).
// An id that is no UUIDv7 is taken for a first publication.
func laterPublication(id string, stored time.Time, window time.Duration) bool {
	made, ok := envelope.ExecutionIDTime(id)
	return ok && stored.After(made.Add(idSkew(window)))
}
