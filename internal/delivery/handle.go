package delivery

import (
	"errors"
	"time"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/broker"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/observe"
	"github.com/nats-io/nats.go/jetstream"
)

// decode reads a delivery's request and the principal its subject names (an
// open server's requests are the anonymous principal's); a message that is
// no request is terminated here.
func (w *Runner) decode(msg jetstream.Msg) (*envelope.Request, string, bool) {
	req, err := envelope.DecodeRequest(msg.Data())
	if err != nil {
		w.undecodable(msg, err)
		return nil, "", false
	}
	principal := w.principalOf(msg)
	if id := msgID(msg); !broker.MsgIDNames(id, principal, req.ExecutionID) {
		// Message ids are scoped by principal (DESIGN §2): one that names
		// another execution is a forgery or a broken client. Refused before
		// anything of it runs; its own execution, if nothing else ends it,
		// ends INPUT_INVALID.
		w.refuseUnrun(msg, principal, req.ExecutionID, req.CapabilityID,
			"The request's message id does not name its execution.", "misnamed",
			"request's message id does not name its execution: refused", "msgId", id)
		return nil, "", false
	}
	return req, principal, true
}

// principalOf is the principal a delivery's subject names (an open server's
// requests are the anonymous principal's).
func (w *Runner) principalOf(msg jetstream.Msg) string {
	principal, _, _ := w.b.Names.ParseExecSubject(msg.Subject())
	if principal == "" {
		principal = broker.Anonymous
	}
	return principal
}

// msgID is a delivery's Nats-Msg-Id header.
func msgID(msg jetstream.Msg) string {
	if h := msg.Headers(); h != nil {
		return h.Get(jetstream.MsgIDHeader)
	}
	return ""
}

// handle decides what one delivery means (DESIGN §5) and acts on it.
func (w *Runner) handle(msg jetstream.Msg) {
	req, principal, ok := w.decode(msg)
	if !ok {
		return
	}
	if x := w.local(broker.Key(principal, req.ExecutionID)); x != nil {
		// A redelivery while this worker still runs the execution: the running
		// delivery's ack settles the message.
		nak(msg, w.cfg.Lease)
		return
	}
	if w.endedUnstarted(msg, principal, req) {
		return
	}
	c := w.cfg.Capability(req.CapabilityID)
	missing := ""
	if c == nil {
		// During a rolling deploy a newer worker may serve it: wait while the
		// catalog lists it.
		if w.cfg.Listed(req.CapabilityID) && envelope.ValidCapabilityID(req.CapabilityID) == nil {
			nak(msg, w.cfg.RolloutDelay)
			return
		}
		missing = "unknown"
	}
	w.claimAndRun(msg, req, c, missing)
}

// claimAndRun runs one delivery as an execution of this worker. A nil capability
// (missing says why) finalizes it CAPABILITY_NOT_FOUND, unless its record
// says otherwise: even then the takeover table decides.
func (w *Runner) claimAndRun(msg jetstream.Msg, req *envelope.Request, c Capability, missing string) {
	if w.base.Err() != nil {
		// Shutting down: leave it to a live worker rather than claim it.
		nak(msg, 0)
		return
	}
	if !w.cfg.DisableLeaseRenewal && !fresh(msg, w.cfg.Lease/10) {
		// The delivery may have waited in the pull buffer: restart its ack
		// timer now, as the claim starts its lease.
		_ = msg.InProgress()
	}
	x := w.newExecution(msg, req, c)
	x.missing = missing
	if !w.start(msg, x) {
		return
	}
	defer w.untrack(x)
	defer x.finish()
	x.claimAndRun()
}

func (x *Execution) finish() {
	x.obs.End()
	close(x.done)
	x.stopLeaseEnd()
	x.stopRenewStart()
	x.stopDeadline()
	x.cancel(nil)
}

// claimAndRun claims the execution and runs it, or decides from the record
// another delivery or worker left.
//
// The first delivery of a request whose id is recent takes the short path
// (DESIGN §14): stages 4 to 9 run before anything is written, and the claim
// is the record of attempt 1 itself, created only if no record exists. A
// recent id's earlier execution, if there was one, still has its record (a
// record outlives its last write by the record window), so the create alone
// tells a duplicate. Every other delivery claims first, as `claimed`, and,
// when no record was there, reads the envelope before running: a
// redelivery, or an id older than the window, may belong to an execution
// whose record is gone.
func (x *Execution) claimAndRun() {
	x.hashInput()
	if x.shortPath() {
		x.hold()
		x.run(true, 0, "")
		return
	}
	rec := x.newRecord(StateClaimed)
	if x.unproven = x.absenceUnproven(); x.unproven {
		// Should this claim be lost before it decides, the takeover of its
		// record must not take it for one of a request that never ran.
		rec.LastError = envelope.CodeWorkerLost
	}
	if !x.create(rec) {
		x.yieldClaim()
		return
	}
	if x.rec.Claim != x.claim || x.rec.State != StateClaimed {
		// Our own create, whose answer was lost, already moved on: not here.
		x.yieldClaim()
		return
	}
	if !x.checkedFresh() {
		return
	}
	x.runClaimed()
}

// shortPath reports whether this delivery may run stages 4 to 9 before its
// claim: the request's first delivery, not a resume, of a capability served
// here, with an id made within the record window.
func (x *Execution) shortPath() bool {
	return x.cap != nil && x.req.ApprovalID == "" && deliveries(x.msg) == 1 &&
		recentID(x.req.ExecutionID, time.Now(), x.w.recentWindow())
}

// recentWindow is how recent an id must be for the short path: the record
// window, or less when envelopes are kept for less (DESIGN §16).
func (w *Runner) recentWindow() time.Duration {
	window := w.b.Config.RecordWindow
	if r := w.envelopeRetention(); r > 0 {
		window = min(window, broker.MaxStartWithin(r))
	}
	return window
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

// newRecord is this delivery's first record of the execution, in state st.
func (x *Execution) newRecord(st State) *Record {
	now := time.Now().UTC()
	rec := &Record{
		V: envelope.Version, ExecutionID: x.req.ExecutionID,
		State: st, Worker: x.w.cfg.ID, Claim: x.claim, LeaseUntil: now.Add(x.w.cfg.Lease),
		CreatedAt: now, UpdatedAt: now,
	}
	rec.claimedFor(x.req, x.inputHash)
	return rec
}

// create writes the execution's first record, create-only, with the record
// window as its TTL. It reports false when a record was there (x.found) or
// the store did not answer (x.found nil); yieldClaim acts on either.
func (x *Execution) create(rec *Record) bool {
	w := x.w
	for try := 0; try < 10; try++ {
		ctx, cancel := x.casCtx()
		endClaim := x.Stage(observe.StageClaim)
		rev, err := w.b.Create(ctx, w.b.Executions, x.key, rec, w.recordTTL(rec))
		endClaim(unlessExists(err))
		cancel()
		if err == nil {
			x.setRecord(rec, rev)
			return true
		}
		if !errors.Is(err, broker.ErrExists) {
			// The create may have happened: the read below decides either way.
			time.Sleep(broker.Backoff(try))
		}
		ctx, cancel = x.casCtx()
		cur, curRev, err := broker.Load[Record](ctx, w.b.Executions, x.key)
		cancel()
		if errors.Is(err, broker.ErrNotFound) {
			continue
		}
		if err != nil {
			w.log.Warn("read execution record", "executionId", x.req.ExecutionID, "err", err)
			return false
		}
		if cur.Claim == x.claim {
			// Our own create, whose answer was lost.
			x.setRecord(cur, curRev)
			return true
		}
		x.found, x.foundRev = cur, curRev
		return false
	}
	return false
}

func (x *Execution) setRecord(rec *Record, rev uint64) {
	x.mu.Lock()
	x.rec, x.rev = rec, rev
	x.mu.Unlock()
}

// yieldClaim ends a claim that did not happen: the record found decides
// (DESIGN §5), or, when the store did not answer, a later delivery does.
func (x *Execution) yieldClaim() {
	x.dropHeld()
	if x.found != nil {
		rec, rev := x.found, x.foundRev
		x.found = nil
		x.decide(rec, rev)
		return
	}
	nak(x.msg, time.Second)
}

// Claim claims an execution that runs stages 4 to 9 before its claim, ahead
// of a stage that writes (the approval gate), and reports whether it may go
// on. When it may not, the record found has decided (the takeover table) and
// the caller returns without finalizing.
func (x *Execution) Claim() bool {
	if x.record0() != nil {
		return true
	}
	if !x.create(x.newRecord(StateClaimed)) {
		x.yieldClaim()
		return false
	}
	x.flushHeld()
	x.startRenewing()
	return true
}

// record0 is the record this execution holds, nil before its claim.
func (x *Execution) record0() *Record {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.rec
}

// checkedFresh reads the envelope of an execution this delivery has just
// claimed with no record before it, when the delivery could not prove the
// execution new (see claimAndRun). An envelope means a duplicate; a
// redelivery stored longer ago than the record window, of an execution not
// eligible for a retry, may have run under a record that expired, and ends
// OUTCOME_UNKNOWN rather than run a second time. It reports whether the
// execution may run.
func (x *Execution) checkedFresh() bool {
	n := deliveries(x.msg)
	if n == 1 && recentID(x.req.ExecutionID, time.Now(), x.w.recentWindow()) {
		return true
	}
	env, err := x.envelope()
	if err != nil && !errors.Is(err, envelope.ErrDecode) {
		x.w.log.Warn("read envelope", "executionId", x.req.ExecutionID, "err", err)
		x.release()
		return false
	}
	if env != nil || err != nil {
		x.stopLease()
		x.w.duplicate(x.msg, x.principal, x.req, x.rec.Worker)
		return false
	}
	if made, ok := envelope.ExecutionIDTime(x.req.ExecutionID); ok && x.w.olderThanRetention(made) {
		// Any envelope of this id would be gone: it cannot be told from one
		// that ran. Refused, never run (DESIGN §16).
		x.refuseExpired(made)
		return false
	}
	if x.unproven && !x.mayRunAgain() {
		x.emit(audit.Requested, nil)
		x.finalize(x.failedAfterRun(outcomeUnknown(expiredRecordMessage)), 0)
		return false
	}
	return true
}

// absenceUnproven reports whether finding no record of this delivery's
// execution would not prove that no attempt of it started (absenceProves).
func (x *Execution) absenceUnproven() bool {
	meta, err := x.msg.Metadata()
	return err != nil || !absenceProves(x.req.ExecutionID, meta.Timestamp, meta.NumDelivered == 1, time.Now(), x.w.b.Config.RecordWindow)
}

// mayRunAgain reports whether an execution whose attempt may have run
// unrecorded may run now: only a capability eligible for a retry after a
// lost worker, and never past the start deadline.
func (x *Execution) mayRunAgain() bool {
	lost := &envelope.CapabilityError{Code: envelope.CodeWorkerLost, Stage: envelope.StageHandler, Retryable: true}
	return x.cap != nil && x.cap.RetryEligible(lost) && !x.startExpired()
}

// expiredRecordMessage is the OUTCOME_UNKNOWN of an execution whose record
// may have expired under an attempt.
const expiredRecordMessage = "An earlier delivery of this operation may have run it under a record that has expired since; it may or may not have taken effect."

// absenceProves reports whether finding no record of an execution proves
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
// backlog longer than the window must still run.
func absenceProves(id string, stored time.Time, firstDelivery bool, now time.Time, window time.Duration) bool {
	if recentID(id, now, window) {
		return true
	}
	skew := idSkew(window)
	if made, ok := envelope.ExecutionIDTime(id); ok && stored.After(made.Add(skew)) {
		return false
	}
	return firstDelivery || now.Sub(stored) < window-skew
}

// refuseExpired ends a request whose id is older than envelopes are kept:
// terminated, audited execution.expired_request, no envelope (its caller's
// await answers EXPIRED).
func (x *Execution) refuseExpired(made time.Time) {
	x.stopLease()
	x.w.log.Warn("request older than the envelope retention: refused", "executionId", x.req.ExecutionID,
		"idTime", made, "retention", x.w.envelopeRetention())
	x.emit(audit.ExpiredRequest, map[string]any{"idTime": made.UTC().Format(time.RFC3339Nano),
		"envelopeRetention": x.w.envelopeRetention().String()})
	_ = x.msg.TermWithReason("request older than the envelope retention")
}

// outcomeUnknown is the error of an attempt whose outcome was lost.
func outcomeUnknown(msg string) *envelope.CapabilityError {
	return &envelope.CapabilityError{Code: envelope.CodeOutcomeUnknown, Stage: envelope.StageHandler, ExposeToModel: true,
		Message: msg}
}

// runClaimed runs an execution this delivery has just claimed.
func (x *Execution) runClaimed() {
	if x.cap == nil {
		x.notFound(true)
		return
	}
	x.run(true, 0, "")
}

// decide handles a delivery whose execution already has a record: the
// takeover table of DESIGN §5.
func (x *Execution) decide(rec *Record, rev uint64) {
	w := x.w
	env, err := x.envelope()
	if errors.Is(err, envelope.ErrDecode) {
		// An envelope is there, whatever it holds: never a new attempt.
		w.log.Error("stored envelope does not decode", "executionId", x.req.ExecutionID, "err", err)
		w.duplicate(x.msg, x.principal, x.req, rec.Worker)
		return
	}
	if err != nil {
		// Unknown is not absent: a takeover now could repeat a finished attempt.
		w.log.Warn("read envelope", "executionId", x.req.ExecutionID, "err", err)
		nak(x.msg, time.Second)
		return
	}
	if env == nil && rec.State == StateFinalized && !w.finalizeRecorded(x, rec) {
		// A finalized record stands for its envelope: written now, or the
		// next delivery tries again.
		nak(x.msg, time.Second)
		return
	}
	if env != nil || rec.State == StateFinalized {
		w.duplicate(x.msg, x.principal, x.req, rec.Worker)
		return
	}
	if field := rec.Conflict(x.req, x.inputHash); field != "" {
		w.conflict(x.msg, x.principal, x.req, rec, field)
		return
	}
	now := time.Now().UTC()
	// A live lease is another claim's, whichever worker id it names: two
	// processes may share one (handle checked that this runner does not run
	// it). A claim of this runner whose answer was lost is waited out too.
	if rec.leaseLive(now) && rec.State != StatePending {
		nak(x.msg, rec.LeaseUntil.Sub(now)+50*time.Millisecond)
		return
	}
	from := rec.Worker
	prev := rec.State
	x.rec, x.rev = rec, rev
	endClaim := x.Stage(observe.StageClaim)
	err = x.update(func(r *Record) {
		r.Worker, r.Claim = w.cfg.ID, x.claim
		r.LeaseUntil = time.Now().UTC().Add(w.cfg.Lease)
		if r.State == StatePending {
			// A cancel's record knew only the id.
			r.State = StateClaimed
			r.claimedFor(x.req, x.inputHash)
		}
	})
	endClaim(err)
	if err != nil && !errors.Is(err, errCancelRequested) {
		// Someone else moved first; the next delivery decides again.
		nak(x.msg, time.Second)
		return
	}
	if prev == StatePending {
		// A cancel came first and left the record; the request itself was
		// never audited.
		x.emit(audit.Requested, nil)
	} else {
		w.takenOver.Add(1)
		x.obs.TakenOver(string(prev))
		x.emit(audit.TakenOver, map[string]any{"fromWorker": from, "state": string(prev), "attempt": rec.Attempt})
	}
	if x.rec.CancelRequested {
		x.finalize(x.cancelled(envelope.CodeCancelled, "The caller cancelled the execution."), x.rec.Attempt)
		return
	}
	switch prev {
	case StateRunning, StateBackoff:
		n := x.rec.Attempt
		lost := &envelope.CapabilityError{Code: envelope.CodeWorkerLost, Stage: envelope.StageHandler, Retryable: true,
			Message: "The worker running the attempt was lost."}
		// Past the TTL deadline nothing starts another attempt: its record
		// would not outlive the request.
		if x.cap != nil && x.cap.RetryEligible(lost) && n < 1+x.cap.Retries() && !x.ttlExpired() {
			x.run(false, n+1, envelope.CodeWorkerLost)
			return
		}
		// Without the capability here, nothing may run it again either.
		if prev == StateBackoff && x.rec.LastError != "" {
			// The attempt failed and was recorded; only its retry was lost.
			last := &envelope.CapabilityError{Code: x.rec.LastError, Stage: envelope.StageHandler, Retryable: true,
				Message: "The operation failed.", ExposeToModel: false}
			if last.Code == envelope.CodeTimeout && x.cap != nil {
				last = x.timeoutError()
			}
			x.finalize(x.afterRun(last), n)
			return
		}
		x.finalize(x.failedAfterRun(outcomeUnknown("The worker running this operation was lost; it may or may not have taken effect.")), n)
	default:
		// The handler never started (pending, claimed): run from the top,
		// unless the request's start deadline has passed. A claim made where
		// no record proved that no attempt had run is marked WORKER_LOST: it
		// decides as that claim would have (checkedFresh).
		if prev == StateClaimed && x.rec.LastError == envelope.CodeWorkerLost && !x.mayRunAgain() {
			x.finalize(x.failedAfterRun(outcomeUnknown(expiredRecordMessage)), 0)
			return
		}
		if x.startExpired() {
			x.w.notStarted.Add(1)
			x.finalize(x.failed(NotStartedError()), 0)
			return
		}
		if x.cap == nil {
			x.notFound(false)
			return
		}
		x.run(false, 0, "")
	}
}

// notFound finalizes an execution of a capability no pool serves.
func (x *Execution) notFound(fresh bool) {
	if fresh {
		x.emit(audit.Requested, nil)
	}
	cerr := NotFoundError()
	x.emit(audit.Denied, map[string]any{"reason": x.missing, "publicCode": string(cerr.Code), "stage": cerr.Stage})
	x.finalize(x.failed(cerr), 0)
}

// NotFoundError is the one answer for an unknown, unexposed or hidden
// capability: the same bytes whichever it was (SI-8).
func NotFoundError() *envelope.CapabilityError {
	return &envelope.CapabilityError{Code: envelope.CodeCapabilityNotFound, Stage: envelope.StageResolve, ExposeToModel: true,
		Message: "No such capability."}
}

// envelope reads the execution's envelope: nil, nil when there is none.
func (x *Execution) envelope() (*envelope.Envelope, error) {
	ctx, cancel := StoreContext()
	defer cancel()
	env, _, err := broker.Load[envelope.Envelope](ctx, x.w.b.Envelopes, x.key)
	if errors.Is(err, broker.ErrNotFound) {
		// A replica catching up after a restart may not have it yet: the
		// stream's leader decides.
		env, _, err = broker.LoadFromLeader[envelope.Envelope](ctx, x.w.nc, x.w.b.Envelopes, x.key)
	}
	if errors.Is(err, broker.ErrNotFound) {
		return nil, nil
	}
	return env, err
}

// duplicate acknowledges a delivery of an execution that is already finalized:
// never a new attempt.
func (w *Runner) duplicate(msg jetstream.Msg, principal string, req *envelope.Request, finalizedBy string) {
	w.auditDuplicate(principal, req, map[string]any{"finalizedBy": finalizedBy})
	ackSync(msg)
}

// auditDuplicate audits a delivery that runs nothing (an execution already
// finalized, a request its execution was not claimed for) with data:
// execution.duplicate_delivery, never a second call.
func (w *Runner) auditDuplicate(principal string, req *envelope.Request, data map[string]any) {
	w.duplicates.Add(1)
	w.emit(&audit.Event{Type: audit.DuplicateDelivery, Surface: req.Surface, Actor: audit.ActorOf(req.Actor),
		Principal: principal, ExecutionID: req.ExecutionID, CapabilityID: req.CapabilityID, CorrelationID: req.CorrelationID,
		TraceID: audit.TraceID(req.Traceparent), Data: data})
}

// undecodable terminates a message that is not a request: it must not be
// redelivered forever. With a usable execution id in its message id, it is
// finalized as INPUT_INVALID so that its caller is not left waiting.
func (w *Runner) undecodable(msg jetstream.Msg, derr error) {
	principal := w.principalOf(msg)
	w.refuseUnrun(msg, principal, broker.ExecutionOfMsgID(msgID(msg), principal),
		w.b.Names.CapabilityFromSubject(msg.Subject()), "The request could not be decoded.", "undecodable",
		"request does not decode: terminated", "err", derr)
}

// refuseUnrun ends a delivery that must never run (a message that is no
// request, or whose message id names another execution), logging why with
// logAttrs: when id is a usable execution id, its execution is finalized
// INPUT_INVALID with message, unless something else ended it; the message is
// terminated once that is so.
func (w *Runner) refuseUnrun(msg jetstream.Msg, principal, id, capID, message, reason, logMsg string, logAttrs ...any) {
	w.log.Warn(logMsg, append([]any{"subject", msg.Subject(), "executionId", id}, logAttrs...)...)
	if envelope.ValidExecutionID(id) == nil {
		env := &envelope.Envelope{ExecutionID: id, CapabilityID: capID, Status: envelope.StatusFailed,
			Error: &envelope.Error{Code: envelope.CodeInputInvalid, Stage: envelope.StageInput, ExposeToModel: true,
				Message: message}}
		x := &Execution{w: w, msg: msg, req: &envelope.Request{ExecutionID: id, CapabilityID: capID},
			principal: principal, key: broker.Key(principal, id)}
		if !w.endWithoutRun(msg, x, env, reason) {
			return // its envelope is not written yet: not terminated
		}
	}
	_ = msg.TermWithReason(logMsg)
}

// endWithoutRun ends a delivery whose request is refused before it can run
// (one that does not decode, a resume refused before it is resolved) with
// env, and reports whether the envelope exists, so that the delivery may be
// settled: a message that leaves the work-queue stream before its envelope
// is written is never finalized (DESIGN §13). An envelope already there is a
// duplicate delivery. A record found in the way decides as the takeover
// table says (a cancel's pending record: CANCELLED; a finalized one: the
// envelope it stands for), through a delivery of its own; any other record
// is another delivery's claim, waited for with a delay.
func (w *Runner) endWithoutRun(msg jetstream.Msg, x *Execution, env *envelope.Envelope, reason string) bool {
	switch ended, err := w.endedBefore(x); {
	case ended:
		return true
	case err != nil:
		nak(msg, time.Second)
		return false
	}
	done, rec, rev := w.finalizeWithoutRun(x, env, reason)
	switch {
	case done:
		return true
	case rec != nil && (rec.State == StatePending || rec.State == StateFinalized):
		// decide settles the delivery itself.
		w.decideFound(msg, x.req, rec, rev)
	case rec != nil:
		nak(msg, max(time.Until(rec.LeaseUntil), time.Second))
	default:
		nak(msg, time.Second) // the store did not answer: decide again later
	}
	return false
}

// endedBefore reports whether x's execution has its envelope already (one
// that does not decode counts: only a finalization writes there), and then
// audits the delivery as a duplicate. An error: the store did not answer.
func (w *Runner) endedBefore(x *Execution) (bool, error) {
	have, err := x.envelope()
	if have == nil && !errors.Is(err, envelope.ErrDecode) {
		return false, err
	}
	finalizedBy := ""
	if have != nil {
		finalizedBy = have.FinalizedBy
	}
	w.auditDuplicate(x.principal, x.req, map[string]any{"finalizedBy": finalizedBy})
	return true, nil
}

// decideFound lets the takeover table decide a delivery of a request that
// was not claimed from the record found in its place.
func (w *Runner) decideFound(msg jetstream.Msg, req *envelope.Request, rec *Record, rev uint64) {
	x := w.newExecution(msg, req, nil)
	if !w.start(msg, x) {
		return
	}
	defer w.untrack(x)
	defer x.finish()
	x.hashInput()
	x.decide(rec, rev)
}

// finalizeWithoutRun writes a finalized record, its trail (requested, denied
// for reason unless it is empty, failed), then the envelope, for a request
// refused before it could run (one that does not decode, one past its start
// deadline). done reports that the envelope exists. If another record
// exists, it owns the id and is returned (found, with its revision); a
// finalized one of the same outcome without its envelope is this path's
// own, interrupted before the envelope. Neither done nor a record: the store
// did not answer.
func (w *Runner) finalizeWithoutRun(x *Execution, env *envelope.Envelope, reason string) (done bool, found *Record, foundRev uint64) {
	id, capID := x.req.ExecutionID, x.req.CapabilityID
	ctx, cancel := StoreContext()
	defer cancel()
	rec := w.finalizedRecord(id, capID, env.Status, env.Error.Code)
	if _, err := w.b.Create(ctx, w.b.Executions, x.key, rec, w.b.Config.RecordWindow); err != nil {
		rec, rev, lerr := broker.Load[Record](ctx, w.b.Executions, x.key)
		if lerr != nil {
			return false, nil, 0
		}
		if rec.State != StateFinalized || rec.CapabilityID != capID || rec.Status != env.Status ||
			rec.LastError != env.Error.Code {
			return false, rec, rev
		}
	}
	x.emit(audit.Requested, nil)
	if reason != "" {
		x.emit(audit.Denied, map[string]any{"reason": reason, "publicCode": string(env.Error.Code), "stage": env.Error.Stage})
	}
	// Only an attempt that may have run under an expired record ends here
	// OUTCOME_UNKNOWN (the sweeper's).
	x.emit(audit.Failed, map[string]any{"code": string(env.Error.Code), "stage": env.Error.Stage,
		"retryable": false, "attempts": 0, "executedBeforeFailure": env.Error.Code == envelope.CodeOutcomeUnknown})
	env.V = envelope.Version
	env.FinalizedBy = w.cfg.ID
	env.FinalizedAt = time.Now().UTC()
	_, err := w.b.Create(ctx, w.b.Envelopes, x.key, env, 0)
	if err == nil {
		w.finalized.Add(1)
		w.observeFinalized(x, env)
	}
	return err == nil || errors.Is(err, broker.ErrExists), nil, 0
}

// observeFinalized tells the observer and the log of an envelope written
// outside the pipeline (finalizeWithoutRun, finalizeRecorded), as finalize
// does of the others: through the delivery's observer when it has one,
// otherwise as an execution of its own that ends with the envelope, so that
// every envelope this worker creates is counted and logged once.
func (w *Runner) observeFinalized(x *Execution, env *envelope.Envelope) {
	if x.obs != nil {
		x.obs.Finalized(env)
	} else {
		_, obs := w.cfg.Observer.Begin(w.base, w.delivery(x.msg, x.req, w.cfg.Capability(x.req.CapabilityID) != nil))
		obs.Finalized(env)
		obs.End()
	}
	w.log.Info("execution finalized", "executionId", env.ExecutionID, "capabilityId", env.CapabilityID,
		"status", env.Status, "code", errorCode(env), "attempts", env.Attempts, "durationMs", env.DurationMs)
}

// handleUnrouted serves the _unrouted consumer: requests a producer sent there
// because its catalog did not list the capability.
func (w *Runner) handleUnrouted(msg jetstream.Msg) {
	req, principal, ok := w.decode(msg)
	if !ok {
		return
	}
	if w.endedUnstarted(msg, principal, req) {
		return
	}
	fwd := msg.Data()
	if req.ApprovalID != "" && req.CapabilityID == "" && w.cfg.ResolveResume != nil {
		// A resume naming only its approval: the approval says the rest.
		ctx, cancel := StoreContext()
		err := w.cfg.ResolveResume(ctx, principal, req)
		cancel()
		var cerr *envelope.CapabilityError
		if err != nil && !errors.As(err, &cerr) {
			w.log.Warn("resume not resolved; delivery left for later", "executionId", req.ExecutionID, "err", err)
			nak(msg, time.Second)
			return
		}
		if cerr != nil {
			x := &Execution{w: w, msg: msg, req: req, principal: principal, key: broker.Key(principal, req.ExecutionID)}
			env := &envelope.Envelope{ExecutionID: req.ExecutionID, CapabilityID: req.CapabilityID, Status: envelope.StatusFailed,
				Error: &envelope.Error{Code: cerr.Code, Stage: cerr.Stage, ExposeToModel: cerr.ExposeToModel, Message: cerr.Message}}
			reason := "resume-refused"
			if cerr.Cause != nil {
				reason += ": " + cerr.Cause.Error()
			}
			if w.endWithoutRun(msg, x, env, reason) {
				ackSync(msg)
			}
			return
		}
		if fwd, err = envelope.Marshal(req); err != nil {
			nak(msg, time.Second)
			return
		}
	}
	if w.cfg.Listed(req.CapabilityID) && envelope.ValidCapabilityID(req.CapabilityID) == nil {
		// The producer's catalog was stale: forward under a distinct message id,
		// since the original id is still in the dedup window. The principal
		// stays the one the server authenticated.
		ctx, cancel := StoreContext()
		defer cancel()
		if _, err := w.b.JS.Publish(ctx, w.b.Names.ExecSubject(principal, req.CapabilityID), fwd,
			jetstream.WithMsgID(w.ids.Forward(principal, req.ExecutionID))); err != nil {
			nak(msg, time.Second)
			return
		}
		ackSync(msg)
		return
	}
	missing := "unknown"
	if envelope.ValidCapabilityID(req.CapabilityID) != nil {
		missing = "invalid-id"
	}
	w.claimAndRun(msg, req, nil, missing)
}

// unlessExists is err, unless it is the ErrExists of a record already there.
func unlessExists(err error) error {
	if errors.Is(err, broker.ErrExists) {
		return nil
	}
	return err
}

// fresh reports whether msg was stored less than d ago: then it cannot have
// waited longer in the pull buffer, its ack timer has nearly all its length
// left, and the lease keeper's first InProgress comes well before it runs out.
func fresh(msg jetstream.Msg, d time.Duration) bool {
	meta, err := msg.Metadata()
	return err == nil && time.Since(meta.Timestamp) < d
}
