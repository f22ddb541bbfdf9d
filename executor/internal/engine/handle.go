package engine

import (
	"errors"
	"time"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/broker"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/observe"
	"github.com/nats-io/nats.go/jetstream"
)

// handle carries one delivery of the pool's consumer through the engine.
func (r *Runner) handle(msg jetstream.Msg) { r.arrive(msg, false).pass() }

// handleUnrouted carries one delivery of the _unrouted consumer (requests a
// producer sent there because its catalog did not list the capability)
// through the engine.
func (r *Runner) handleUnrouted(msg jetstream.Msg) { r.arrive(msg, true).pass() }

// arrive is an execution of a delivery, and what the delivery means before
// anything of it is read (DESIGN §5): a request to refuse unrun (one that
// does not decode, whose message id names another execution), a
// redelivery of an execution this worker runs, or what the takeover table
// says of a request whose record is not read yet (end it NOT_STARTED, or
// claim it).
func (r *Runner) arrive(msg jetstream.Msg, unrouted bool) *Execution {
	principal := r.principalOf(msg)
	req, err := envelope.DecodeRequest(msg.Data())
	if err != nil {
		e := r.bare(msg, &envelope.Request{ExecutionID: broker.ExecutionOfMsgID(msgID(msg), principal),
			CapabilityID: r.b.Names.CapabilityFromSubject(msg.Subject())}, principal)
		e.next = e.refusal("The request could not be decoded.", "undecodable", "request does not decode: terminated",
			"err", err)
		return e
	}
	e := r.bare(msg, req, principal)
	e.unrouted = unrouted
	switch id := msgID(msg); {
	case !broker.MsgIDNames(id, principal, req.ExecutionID):
		// Message ids are scoped by principal (DESIGN §2): one that names
		// another execution is a forgery or a broken client. Refused before
		// anything of it runs; its own execution, if nothing else ends it,
		// ends INPUT_INVALID.
		e.next = e.refusal("The request's message id does not name its execution.", "misnamed",
			"request's message id does not name its execution: refused", "msgId", id)
	case !unrouted && r.local(e.key) != nil:
		// A redelivery while this worker still runs the execution: the running
		// delivery's ack settles the message.
		e.next = Action{Do: Wait, Delay: r.cfg.Lease}
	default:
		e.next = Takeover(e.delivery.facts(r.windows(), r.now()))
	}
	return e
}

// refusal is the Refuse of a delivery that must never run, logged with
// logMsg and logAttrs: its execution, if its id is one, ends INPUT_INVALID
// with message, unless something else ended it; then the message is
// terminated.
func (e *Execution) refusal(message, reason, logMsg string, logAttrs ...any) Action {
	e.r.log.Warn(logMsg, append([]any{"subject", e.msg.Subject(), "executionId", e.req.ExecutionID}, logAttrs...)...)
	return Action{Do: Refuse, Reason: reason, term: logMsg, Err: &envelope.CapabilityError{Code: envelope.CodeInputInvalid,
		Stage: envelope.StageInput, ExposeToModel: true, Message: message}}
}

// pass carries out the delivery's actions, each returning the one that
// follows, until the delivery is settled; then it gives back what the
// delivery held.
func (e *Execution) pass() {
	for a := e.next; a.Do != 0; {
		a = e.apply(a)
	}
	e.releaseLimits()
	if e.begun {
		e.finish()
		e.r.untrack(e)
	}
	if e.shared != nil {
		e.shared.give(e.principal)
	}
}

// apply carries out one action — a decision of the takeover table (DESIGN
// §5), or of the engine's own steps — and returns the action that follows:
// none once the delivery is settled. It is the one place where an action is
// acted on.
func (e *Execution) apply(a Action) Action {
	if a.TakeOver {
		return e.takeOver(a)
	}
	switch a.Do {
	case Claim:
		return e.enter()
	case EndNotStarted:
		return e.endNotStarted()
	case Refuse:
		return e.refuse(a)
	case Duplicate:
		return e.duplicate()
	case RestoreEnvelope:
		return e.restore()
	case Conflict:
		return e.conflict(a.Field)
	case Wait:
		return e.wait(a)
	case Release:
		return e.release()
	case RefuseExpired:
		return e.refuseExpired()
	case Run:
		return e.run(0, "")
	case Retry:
		e.retryReason = a.Reason
		return e.run(a.Attempts, envelope.CodeWorkerLost)
	case Recover:
		return e.recover(a)
	case Reconcile:
		return e.reconcile(a.Attempts)
	case AwaitApproval:
		return e.awaitApproval(a.need)
	case NotFound:
		return e.notFound()
	case NotStarted:
		e.r.notStarted.Add(1)
		return e.finalize(failed(NotStartedError()), 0)
	case Cancel:
		return e.finalize(stopped(CancelledError()), a.Attempts)
	case Fail:
		return e.finalize(afterRun(a.Err), a.Attempts)
	case Finish:
		return e.finalize(a.end, a.Attempts)
	}
	return Action{}
}

// principalOf is the principal a delivery's subject names (an open server's
// requests are the anonymous principal's).
func (r *Runner) principalOf(msg jetstream.Msg) string {
	principal, _, _ := r.b.Names.ParseExecSubject(msg.Subject())
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

// enter is the Claim of a request no record was read for: it takes its
// principal's fair share of the slots and its capability — during a rolling
// deploy, a capability the catalog lists but this worker lacks is left for
// a worker that serves it — and claims it (execute).
func (e *Execution) enter() Action {
	if e.unrouted {
		return e.route()
	}
	r := e.r
	if share := r.share.Load(); share != nil {
		if !share.take(e.principal, r.now()) {
			// Over its principal's fair share while others wait: nothing of
			// it was read or written; a later delivery runs it.
			r.deferred.Add(1)
			return Action{Do: Wait, Delay: shareDelay()}
		}
		e.shared = share
	}
	c := r.cfg.Capabilities[e.req.CapabilityID]
	if c == nil {
		switch listed, err := r.cfg.Listed(e.req.CapabilityID); {
		case err != nil:
			return Action{Do: Wait, Delay: time.Second} // the store did not answer: decide again later
		case listed && envelope.ValidCapabilityID(e.req.CapabilityID) == nil:
			return Action{Do: Wait, Delay: rolloutDelay(r.cfg.RolloutDelay, e.delivery.Deliveries)}
		}
		e.missing = "unknown"
	}
	return e.execute(c)
}

// route is the Claim of a delivery of _unrouted: a resume naming only its
// approval is resolved first; a request the catalog lists after all is
// forwarded to its pool, under a message id of its own; any other is
// claimed here, to end CAPABILITY_NOT_FOUND.
func (e *Execution) route() Action {
	r, req := e.r, e.req
	fwd := e.msg.Data()
	if req.ApprovalID != "" && req.CapabilityID == "" && r.cfg.ResolveResume != nil {
		// A resume naming only its approval: the approval says the rest.
		ctx, cancel := StoreContext()
		err := r.cfg.ResolveResume(ctx, e.principal, req)
		cancel()
		var cerr *envelope.CapabilityError
		if err != nil && !errors.As(err, &cerr) {
			r.log.Warn("resume not resolved; delivery left for later", "executionId", req.ExecutionID, "err", err)
			return Action{Do: Wait, Delay: time.Second}
		}
		if cerr != nil {
			reason := "resume-refused"
			if cerr.Cause != nil {
				reason += ": " + cerr.Cause.Error()
			}
			return Action{Do: Refuse, Err: cerr, Reason: reason}
		}
		if fwd, err = envelope.Marshal(req); err != nil {
			return Action{Do: Wait, Delay: time.Second}
		}
	}
	listed, err := r.cfg.Listed(req.CapabilityID)
	if err != nil {
		return Action{Do: Wait, Delay: time.Second} // the store did not answer: decide again later
	}
	if listed && envelope.ValidCapabilityID(req.CapabilityID) == nil {
		// The producer's catalog was stale: forward under a distinct message id,
		// since the original id is still in the dedup window. The principal
		// stays the one the server authenticated.
		ctx, cancel := StoreContext()
		defer cancel()
		if _, err := r.b.JS.Publish(ctx, r.b.Names.ExecSubject(e.principal, req.CapabilityID), fwd,
			jetstream.WithMsgID(r.ids.Forward(e.principal, req.ExecutionID))); err != nil {
			return Action{Do: Wait, Delay: time.Second}
		}
		ackSync(e.msg)
		return Action{}
	}
	e.missing = "unknown"
	if envelope.ValidCapabilityID(req.CapabilityID) != nil {
		e.missing = "invalid-id"
	}
	return e.execute(nil)
}

// rolloutDelay is how long a delivery of a capability this worker lacks,
// but the catalog lists, is left for a worker that serves it, at its
// deliveries-th delivery: 100 ms at the first, twice as long at each next,
// at most most. The first is short: a worker that serves it may already be
// pulling from the same consumer (a new worker of the same pool); the growth
// keeps a fleet of older workers from passing a request around while no new
// one is there to take it.
func rolloutDelay(most time.Duration, deliveries int) time.Duration {
	d := 100 * time.Millisecond << min(max(deliveries-1, 0), 16)
	return min(d, most)
}

// delivered is what msg's metadata says of its delivery of req.
func delivered(msg jetstream.Msg, req *envelope.Request) Delivery {
	d := Delivery{ID: req.ExecutionID, StartBy: req.StartBy}
	if meta, err := msg.Metadata(); err == nil {
		d.Stored, d.Deliveries = meta.Timestamp, int(meta.NumDelivered)
	}
	return d
}

// execute begins the delivery as an execution of this worker, of the
// capability c (nil: none served here; missing says why), and claims it.
func (e *Execution) execute(c Definition) Action {
	r := e.r
	if r.base.Err() != nil {
		// Shutting down: leave it to a live worker rather than claim it.
		return Action{Do: Wait}
	}
	if !r.cfg.DisableLeaseRenewal && (e.delivery.Stored.IsZero() || r.now().Sub(e.delivery.Stored) >= r.cfg.Lease/10) {
		// The delivery may have waited in the pull buffer: restart its ack
		// timer now, as the claim starts its lease. (A message stored less
		// than a tenth of the lease ago cannot have waited longer: its ack
		// timer has nearly all its length left, and the lease keeper's first
		// InProgress comes well before it runs out.)
		_ = e.msg.InProgress()
	}
	if !e.begin(c) {
		return Action{Do: Wait, Delay: r.cfg.Lease}
	}
	return e.claimNew()
}

// finish ends the execution's observation, lease and context: its delivery
// is done with, whatever became of it.
func (e *Execution) finish() {
	e.obs.End()
	close(e.done)
	e.lease.disarm()
	e.stopDeadline()
	e.cancel(nil)
}

// claimNew claims an execution no record was found for, and returns what
// follows: running it, or what the takeover table says of the record found
// in its way.
//
// The first delivery of a request whose id is recent takes the short path
// (DESIGN §14): stages 4 to 9 run before anything is written, and the claim
// is the record of attempt 1 itself, created only if no record exists. A
// recent id's earlier execution, if there was one, still has its record (a
// record outlives its last write by the record window), so the create alone
// tells a duplicate. Every other delivery claims first, as `claimed`, and,
// when no record was there, reads the envelope before running: a
// redelivery, or an id older than the window, may belong to an execution
// whose record is gone. The takeover table's rows of a missing record decide
// (Facts.Claimed).
func (e *Execution) claimNew() Action {
	e.hashInput()
	if e.shortPath() {
		e.trail.hold()
		e.unaudited = true
		return Action{Do: Run}
	}
	rec := e.newRecord(StateClaimed)
	if e.unproven = !e.delivery.facts(e.r.windows(), e.r.now()).AbsenceProves; e.unproven {
		// Should this claim be lost before it decides, the takeover of its
		// record must not take it for one of a request that never ran.
		rec.LastError = envelope.CodeWorkerLost
	}
	if !e.create(rec) {
		return e.yield()
	}
	if r := e.claim.held(); r.Claim != e.claim.token || r.State != StateClaimed {
		// Our own create, whose answer was lost, already moved on: not here.
		return e.yield()
	}
	e.unaudited = true
	f := e.facts(nil, EnvelopeNotRead)
	f.Claimed = true
	if !f.FirstRecent {
		f.Envelope = e.readEnvelope()
	}
	return Takeover(f)
}

// shortPath reports whether this delivery may run stages 4 to 9 before its
// claim: the request's first delivery, not a resume, of a capability served
// here, with an id made within the record window.
func (e *Execution) shortPath() bool {
	return e.cap != nil && e.req.ApprovalID == "" && e.delivery.facts(e.r.windows(), e.r.now()).FirstRecent
}

// yield ends a claim that did not happen: the record found decides (the
// takeover table), or, when the store did not answer, a later delivery
// does.
func (e *Execution) yield() Action {
	e.trail.drop()
	e.unaudited = false
	if e.found == nil {
		return Action{Do: Wait, Delay: time.Second}
	}
	return Takeover(e.facts(e.found, e.readEnvelope()))
}

// readEnvelope reads the execution's envelope for the takeover table.
func (e *Execution) readEnvelope() EnvelopeRead {
	env, err := e.envelope()
	read := classifyEnvelope(env, err)
	switch read {
	case EnvelopeUndecodable:
		e.r.log.Error("stored envelope does not decode", "executionId", e.req.ExecutionID, "err", err)
	case EnvelopeUnknown:
		e.r.log.Warn("read envelope", "executionId", e.req.ExecutionID, "err", err)
	}
	return read
}

// lostWorker is the error of an attempt lost with its worker, as the retry
// rule is asked about it.
var lostWorker = &envelope.CapabilityError{Code: envelope.CodeWorkerLost, Stage: envelope.StageHandler, Retryable: true,
	Message: "The worker running the attempt was lost."}

// facts gathers what the takeover table decides from: the record found (nil:
// none), the envelope read, and this delivery's request and metadata.
func (e *Execution) facts(rec *Record, read EnvelopeRead) Facts {
	f := e.delivery.facts(e.r.windows(), e.r.now())
	f.Record, f.Envelope, f.Known, f.AbsenceProves = rec, read, e.cap != nil, !e.unproven
	if rec != nil {
		f.Conflict = conflict(rec, e.req, e.inputHash)
	}
	if c := e.cap; c != nil {
		f.Timeout = c.Timeout()
		f.Retry = func(n int) bool { _, ok := c.Retry(n, lostWorker); return ok }
		f.Recovery = c.Recovery()
	}
	f.IDExpired = func() bool {
		made, ok := envelope.ExecutionIDTime(e.req.ExecutionID)
		return ok && e.r.olderThanRetention(made)
	}
	return f
}

// takeOver takes the record found, another claim's whose lease ran out (or
// a cancel's), by compare-and-swap, audits it, and returns the action that
// follows once the swap holds it: a cancel recorded meanwhile ends it
// (Action.AfterTakeover).
func (e *Execution) takeOver(a Action) Action {
	rec, rev := e.found, e.foundRev
	e.found = nil
	from, prev := rec.Worker, rec.State
	e.claim.hold(rec, rev)
	endClaim := e.stage(observe.StageClaim)
	err := e.claim.update(func(r *Record) {
		r.Worker, r.Claim = e.r.cfg.ID, e.claim.token
		r.LeaseUntil = e.r.now().UTC().Add(e.r.cfg.Lease)
		if r.State == StatePending {
			// A cancel's record knew only the id.
			r.State = StateClaimed
			claimedFor(r, e.req, e.inputHash)
		}
		if a.Do == Reconcile {
			// Held as reconciling{n}: a worker lost while it asks is taken
			// over like one lost during an attempt (DESIGN §5).
			r.State = StateReconciling
			r.Reconciliations++
		}
	})
	endClaim(err)
	if err != nil && !errors.Is(err, errCancelRequested) {
		// Someone else moved first; the next delivery decides again.
		e.claim.drop()
		return Action{Do: Wait, Delay: time.Second}
	}
	switch {
	case prev == StatePending:
		// A cancel came first and left the record; the request itself was
		// never audited.
		e.emit(audit.EventRequested, nil)
	case from == "":
		// Left waiting for a limit (capability.limited is in the trail) by
		// a worker that gave it back: resumed, not taken over.
	default:
		e.r.takenOver.Add(1)
		e.obs.TakenOver(string(prev))
		e.emit(audit.EventTakenOver, map[string]any{"fromWorker": from, "state": string(prev), "attempt": rec.Attempt})
	}
	a = a.AfterTakeover(e.claim.held())
	a.TakeOver = false
	return a
}

// refuseExpired ends a request whose id is older than envelopes are kept:
// terminated, audited execution.expired_request, no envelope (its caller's
// await answers EXPIRED).
func (e *Execution) refuseExpired() Action {
	made, _ := envelope.ExecutionIDTime(e.req.ExecutionID)
	e.lease.halt()
	e.r.log.Warn("request older than the envelope retention: refused", "executionId", e.req.ExecutionID,
		"idTime", made, "retention", e.r.envelopeRetention())
	e.emit(audit.EventExpiredRequest, map[string]any{"idTime": made.UTC().Format(time.RFC3339Nano),
		"envelopeRetention": e.r.envelopeRetention().String()})
	_ = e.msg.TermWithReason("request older than the envelope retention")
	return Action{}
}

// audited files stage 2's capability.requested of an execution this
// delivery claimed fresh, once, before anything else of it: the request is
// audited before anything can refuse it.
func (e *Execution) audited() {
	if e.unaudited {
		e.unaudited = false
		e.emit(audit.EventRequested, nil)
	}
}

// notFound ends an execution of a capability no pool serves:
// CAPABILITY_NOT_FOUND, denied for the reason missing says.
func (e *Execution) notFound() Action {
	e.audited()
	cerr := NotFoundError()
	e.emit(audit.EventDenied, map[string]any{"reason": e.missing, "publicCode": string(cerr.Code), "stage": cerr.Stage})
	return Action{Do: Finish, end: failed(cerr)}
}

// duplicate acknowledges a delivery of an execution that has ended: never
// a new attempt. The record found, or this delivery's claim, names who
// finalized it.
func (e *Execution) duplicate() Action {
	e.lease.halt()
	by := e.found
	if by == nil {
		by = e.claim.held()
	}
	e.auditDuplicate(map[string]any{"finalizedBy": by.Worker})
	ackSync(e.msg)
	return Action{}
}

// restore writes the envelope the finalized record found stands for, then
// acknowledges the delivery as a duplicate; the next delivery tries again
// when it could not.
func (e *Execution) restore() Action {
	if !e.finalizeRecorded(e.found) {
		return Action{Do: Wait, Delay: time.Second}
	}
	return e.duplicate()
}

// auditDuplicate audits a delivery that runs nothing (an execution already
// finalized, a request its execution was not claimed for) with data:
// execution.duplicate_delivery, never a second call.
func (e *Execution) auditDuplicate(data map[string]any) {
	e.r.duplicates.Add(1)
	req := e.req
	e.r.emit(&audit.Event{Type: audit.EventDuplicateDelivery, Surface: req.Surface, Actor: audit.ActorOf(req.Actor),
		Principal: e.principal, ExecutionID: req.ExecutionID, CapabilityID: req.CapabilityID, CorrelationID: req.CorrelationID,
		TraceID: audit.TraceID(req.Traceparent), Data: data})
}

// conflict acks, without running it, a request whose execution's record was
// claimed for another request under the same id (Record.Conflict names the
// field that differs), and audits it as a duplicate delivery with the field
// and the record's capability. Nothing of the execution changes: the request
// the record names still decides it.
func (e *Execution) conflict(field string) Action {
	rec, req := e.found, e.req
	e.r.log.Warn("a request differs from the one its execution was claimed for: acknowledged, not run",
		"executionId", req.ExecutionID, "capabilityId", req.CapabilityID, "field", field)
	e.auditDuplicate(map[string]any{"conflict": field, "claimedFor": rec.CapabilityID, "claimedBy": rec.Worker})
	ackSync(e.msg)
	return Action{}
}

// refuse ends a request that must never run (Refuse) with a.Err, without
// running it (endWithoutRun), and settles the delivery once its envelope
// exists: terminated, or acknowledged. An id that is no execution id ends
// nothing: the message is terminated at once.
func (e *Execution) refuse(a Action) Action {
	if envelope.ValidExecutionID(e.req.ExecutionID) == nil {
		env := &envelope.Envelope{ExecutionID: e.req.ExecutionID, CapabilityID: e.req.CapabilityID, Status: envelope.StatusFailed,
			Error: &envelope.Error{Code: a.Err.Code, Stage: a.Err.Stage, ExposeToModel: a.Err.ExposeToModel, Message: a.Err.Message}}
		if next, done := e.endWithoutRun(env, a.Reason); !done {
			return next // its envelope is not written yet: not settled
		}
	}
	if a.term != "" {
		_ = e.msg.TermWithReason(a.term)
	} else {
		ackSync(e.msg)
	}
	return Action{}
}

// endWithoutRun ends a delivery whose request is refused before it can run
// (one that does not decode, a resume refused before it is resolved) with
// env, and reports whether the envelope exists, so that the delivery may be
// settled: a message that leaves the work-queue stream before its envelope
// is written is never finalized (DESIGN §13). An envelope already there is a
// duplicate delivery. A record found in the way decides as the takeover
// table says (a cancel's pending record: CANCELLED; a finalized one: the
// envelope it stands for); any other record is another delivery's claim,
// waited for with a delay.
func (e *Execution) endWithoutRun(env *envelope.Envelope, reason string) (Action, bool) {
	switch ended, err := e.endedBefore(); {
	case ended:
		return Action{}, true
	case err != nil:
		return Action{Do: Wait, Delay: time.Second}, false
	}
	done, rec, rev := e.finalizeWithoutRun(env, reason)
	switch {
	case done:
		return Action{}, true
	case rec != nil && (rec.State == StatePending || rec.State == StateFinalized):
		// Decided as a delivery of an unknown capability that found it.
		if !e.begin(nil) {
			return Action{Do: Wait, Delay: e.r.cfg.Lease}, false
		}
		e.hashInput()
		e.found, e.foundRev = rec, rev
		return Takeover(e.facts(rec, e.readEnvelope())), false
	case rec != nil:
		return Action{Do: Wait, Delay: max(rec.LeaseUntil.Sub(e.r.now()), time.Second)}, false
	}
	return Action{Do: Wait, Delay: time.Second}, false // the store did not answer: decide again later
}

// endedBefore reports whether the execution has its envelope already (one
// that does not decode counts: only a finalization writes there), and then
// audits the delivery as a duplicate. An error: the store did not answer.
func (e *Execution) endedBefore() (bool, error) {
	have, err := e.envelope()
	if have == nil && !errors.Is(err, envelope.ErrDecode) {
		return false, err
	}
	finalizedBy := ""
	if have != nil {
		finalizedBy = have.FinalizedBy
	}
	e.auditDuplicate(map[string]any{"finalizedBy": finalizedBy})
	return true, nil
}

// endNotStarted ends a delivery whose request is past its start deadline
// and has no record (EndNotStarted): NOT_STARTED, its record finalized
// first. A delivery of a request that has ended already is a duplicate. A
// record found in the way is claimed as any other (Claim), and the takeover
// table decides from it.
func (e *Execution) endNotStarted() Action {
	switch ended, err := e.endedBefore(); {
	case ended:
		ackSync(e.msg)
		return Action{}
	case err != nil:
		return Action{Do: Wait, Delay: time.Second} // the store did not answer: decide again later
	}
	e.hashInput()
	done, found, _ := e.finalizeWithoutRun(notStartedEnvelope(e.req), "")
	switch {
	case done:
		e.r.notStarted.Add(1)
		ackSync(e.msg)
		return Action{}
	case found != nil:
		return Action{Do: Claim}
	}
	return Action{Do: Wait, Delay: time.Second} // the store did not answer: decide again later
}

// wait leaves the delivery for a later one (Wait): after a.Delay, when it
// holds no claim. A claim it holds is given back first, its lease ended
// now: for a limit, its record names no worker meanwhile and the delivery
// comes back after a.Delay; otherwise it comes back at once.
func (e *Execution) wait(a Action) Action {
	if e.claim.held() != nil && !a.limit {
		return e.release()
	}
	e.releaseThen(a.limit, func() { nak(e.msg, a.Delay) })
	return Action{}
}

// release gives the execution back (Release): the lease ends now and the
// message is redelivered at once, so a live worker takes it over.
func (e *Execution) release() Action {
	e.releaseThen(false, func() { _ = e.msg.Nak() })
	return Action{}
}
