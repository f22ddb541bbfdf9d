package engine

import (
	"errors"
	"log/slog"
	"time"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/observe"
	"github.com/nats-io/nats.go/jetstream"
)

// delivery is one delivery of a request, carried through the engine in one
// pass (DESIGN §5): what it means is decided from the facts it finds — by
// the takeover table, or the other pure rules — as an Action, and apply
// carries each action out; each step returns the action that follows, until
// the delivery is settled (acknowledged, redelivered or terminated).
type delivery struct {
	w   *worker
	msg jetstream.Msg
	// x is the execution the delivery works on; attempts runs it.
	x        execution
	attempts attempts
	// first is what the delivery means as it arrives (arrive).
	first Action
	// unrouted: a delivery of the _unrouted consumer.
	unrouted bool
	// begun: its execution is one of this worker's, in flight here (begin).
	begun bool
	// shared is the fair share the delivery holds a slot of, nil for none.
	shared *fairShare
}

// arrive is a delivery of msg, and what it means before anything of it is
// read: a request to refuse unrun (one that does not decode, whose message
// id names another execution), a redelivery of an execution this worker
// runs, or what the takeover table says of a request whose record is not
// read yet (end it NOT_STARTED, or claim it).
func arrive(w *worker, msg jetstream.Msg, unrouted bool) *delivery {
	d := &delivery{w: w, msg: msg, unrouted: unrouted}
	d.attempts.x, d.attempts.receipts.x = &d.x, &d.x
	principal := w.principalOf(msg)
	req, err := envelope.DecodeRequest(msg.Data())
	if err != nil {
		req = &envelope.Request{ExecutionID: broker.ExecutionOfMsgID(msgID(msg), principal),
			CapabilityID: w.b.Names.CapabilityFromSubject(msg.Subject())}
		d.x.prepare(w, req, principal, delivered(msg, req))
		d.first = refusal(w.log, msg, req.ExecutionID, "The request could not be decoded.", "undecodable",
			"request does not decode: terminated", "err", err)
		return d
	}
	d.x.prepare(w, req, principal, delivered(msg, req))
	switch id := msgID(msg); {
	case !broker.MsgIDNames(id, principal, req.ExecutionID):
		// Message ids are scoped by principal (DESIGN §2): one that names
		// another execution is a forgery or a broken client. Refused before
		// anything of it runs; its own execution, if nothing else ends it,
		// ends INPUT_INVALID.
		d.first = refusal(w.log, msg, req.ExecutionID, "The request's message id does not name its execution.", "misnamed",
			"request's message id does not name its execution: refused", "msgId", id)
	case !unrouted && w.inflight.get(d.x.key) != nil:
		// A redelivery while this worker still runs the execution: the running
		// delivery's ack settles the message.
		d.first = Action{Do: Wait, Delay: w.cfg.Lease}
	default:
		d.first = Takeover(d.x.meta.facts(w.windows(), w.now()))
	}
	return d
}

// pass carries out the delivery's actions, each returning the one that
// follows, until the delivery is settled; then it gives back what the
// delivery held.
func (d *delivery) pass() {
	for a := d.first; a.Do != 0; {
		a = d.apply(a)
	}
	d.attempts.releaseLimits()
	if d.begun {
		d.x.finish()
		d.w.inflight.remove(d.x.key)
	}
	if d.shared != nil {
		d.shared.give(d.x.principal)
	}
}

// apply carries out one action — a decision of the takeover table (DESIGN
// §5), or of the engine's own steps — and returns the action that follows:
// none once the delivery is settled. It is the one place where an action is
// acted on.
func (d *delivery) apply(a Action) Action {
	if a.TakeOver && d.w.draining.Load() {
		// Shutting down: a live worker takes it over.
		return Action{Do: Wait}
	}
	if a.TakeOver {
		return d.takeOver(a)
	}
	switch a.Do {
	case Claim:
		return d.enter()
	case EndNotStarted:
		return d.endNotStarted()
	case Refuse:
		return d.refuse(a)
	case Duplicate:
		return d.duplicate()
	case RestoreEnvelope:
		return d.restore()
	case Conflict:
		return d.conflict(a.Field)
	case Wait:
		return d.wait(a)
	case Release:
		return d.release()
	case RefuseExpired:
		return d.refuseExpired()
	case Run:
		return d.attempts.run(0, "")
	case Retry:
		d.attempts.retryReason = a.Reason
		return d.attempts.run(a.Attempts, envelope.CodeWorkerLost)
	case Recover:
		return d.attempts.recover(a)
	case Reconcile:
		return d.attempts.reconcile(a.Attempts)
	case AwaitApproval:
		return d.awaitApproval(a.need)
	case NotFound:
		return d.notFound()
	case NotStarted:
		d.w.stats.notStarted.Add(1)
		return d.finalize(failed(NotStartedError()), 0)
	case Cancel:
		end := a.Err // a lost attempt's: it may have taken effect
		if end == nil {
			end = CancelledError()
		}
		return d.finalize(stopped(end), a.Attempts)
	case Fail:
		return d.finalize(afterRun(a.Err), a.Attempts)
	case Finish:
		return d.finalize(a.end, a.Attempts)
	}
	return Action{}
}

// refusal is the Refuse of a delivery of msg that must never run, logged
// with logMsg and logAttrs: its execution, if id is one, ends INPUT_INVALID
// with message, unless something else ended it; then the message is
// terminated.
func refusal(log *slog.Logger, msg jetstream.Msg, id, message, reason, logMsg string, logAttrs ...any) Action {
	log.Warn(logMsg, append([]any{"subject", msg.Subject(), "executionId", id}, logAttrs...)...)
	return Action{Do: Refuse, Reason: reason, term: logMsg, Err: inputInvalid(message)}
}

// msgID is a delivery's Nats-Msg-Id header.
func msgID(msg jetstream.Msg) string {
	if h := msg.Headers(); h != nil {
		return h.Get(jetstream.MsgIDHeader)
	}
	return ""
}

// delivered is what msg's metadata says of its delivery of req.
func delivered(msg jetstream.Msg, req *envelope.Request) Delivery {
	d := Delivery{ID: req.ExecutionID, StartBy: req.StartBy}
	if meta, err := msg.Metadata(); err == nil {
		d.Stored, d.Deliveries = meta.Timestamp, int(meta.NumDelivered)
	}
	return d
}

// enter is the Claim of a request no record was read for: it takes its
// principal's fair share of the slots and its capability — during a rolling
// deploy, a capability the catalog lists but this worker lacks is left for
// a worker that serves it — and claims it (execute).
func (d *delivery) enter() Action {
	if d.unrouted {
		return d.route()
	}
	w, x := d.w, &d.x
	if a, held := d.heldAgain(); held {
		return a // still paused: nothing of it read beyond its record
	}
	if share := w.share.Load(); share != nil {
		if !share.take(x.principal, w.now()) {
			// Over its principal's fair share while others wait: nothing of
			// it was read or written; a later delivery runs it.
			w.stats.deferred.Add(1)
			return Action{Do: Wait, Delay: shareDelay(x.meta.Deliveries)}
		}
		d.shared = share
	}
	c := w.cfg.Capabilities[x.req.CapabilityID]
	if c == nil {
		switch listed, err := w.cfg.Listed(x.req.CapabilityID); {
		case err != nil:
			return Action{Do: Wait, Delay: time.Second} // the store did not answer: decide again later
		case listed && envelope.ValidCapabilityID(x.req.CapabilityID) == nil:
			return Action{Do: Wait, Delay: rolloutDelay(w.cfg.RolloutDelay, x.meta.Deliveries)}
		}
		x.missing = "unknown"
	}
	return d.execute(c)
}

// route is the Claim of a delivery of _unrouted: a resume naming only its
// approval is resolved first; a request the catalog lists after all is
// forwarded to its pool, under a message id of its own; any other is
// claimed here, to end CAPABILITY_NOT_FOUND.
func (d *delivery) route() Action {
	w, x, req := d.w, &d.x, d.x.req
	fwd := d.msg.Data()
	if req.ApprovalID != "" && req.CapabilityID == "" && w.cfg.ResolveResume != nil {
		// A resume naming only its approval: the approval says the rest.
		ctx, cancel := StoreContext()
		err := w.cfg.ResolveResume(ctx, x.principal, req)
		cancel()
		var cerr *envelope.CapabilityError
		if err != nil && !errors.As(err, &cerr) {
			w.log.Warn("resume not resolved; delivery left for later", "executionId", req.ExecutionID, "err", err)
			return Action{Do: Wait, Delay: time.Second}
		}
		if cerr != nil {
			reason := "resume-refused"
			if cerr.Cause != nil {
				reason += ": " + cerr.Cause.Error()
			}
			// The envelope says the refusal's code, stage and message.
			return Action{Do: Refuse, Reason: reason, Err: &envelope.CapabilityError{Code: cerr.Code, Stage: cerr.Stage,
				ExposeToModel: cerr.ExposeToModel, Message: cerr.Message}}
		}
		if fwd, err = envelope.Marshal(req); err != nil {
			return Action{Do: Wait, Delay: time.Second}
		}
	}
	listed, err := w.cfg.Listed(req.CapabilityID)
	if err != nil {
		return Action{Do: Wait, Delay: time.Second} // the store did not answer: decide again later
	}
	if listed && envelope.ValidCapabilityID(req.CapabilityID) == nil {
		// The producer's catalog was stale: forward under a distinct message id,
		// since the original id is still in the dedup window. The principal
		// stays the one the server authenticated.
		ctx, cancel := StoreContext()
		defer cancel()
		if _, err := w.b.JS.Publish(ctx, w.b.Names.ExecSubject(x.principal, req.CapabilityID), fwd,
			jetstream.WithMsgID(w.ids.Forward(x.principal, req.ExecutionID))); err != nil {
			if full := broker.AsQueueFull(err); full != nil {
				// The principal's queue, which holds this request too, is
				// full: the forward would wait on the principal's own
				// backlog for ever. Refused now, as its publication would
				// have been (DESIGN §12 "Quotas").
				return d.refuseFull(full)
			}
			return Action{Do: Wait, Delay: time.Second}
		}
		ackSync(d.msg)
		return Action{}
	}
	x.missing = "unknown"
	if envelope.ValidCapabilityID(req.CapabilityID) != nil {
		x.missing = "invalid-id"
	}
	return d.execute(nil)
}

// refuseFull is the Refuse of a request from the unrouted subject whose
// forward its principal's full queue refused: QUOTA_EXCEEDED with the
// queue's limit, nothing run, counted by the observer.
func (d *delivery) refuseFull(full *broker.QueueFullError) Action {
	w, principal := d.w, d.x.principal
	limit := int64(-1)
	ctx, cancel := StoreContext()
	if u, err := w.b.QueueUsageOf(ctx, principal); err == nil {
		limit = broker.QueueLimit(u, full.Quota)
	}
	cancel()
	w.cfg.Observer.QuotaExceeded(full.Quota, principal)
	return Action{Do: Refuse, Err: full.QuotaError(limit), Reason: "quota: " + full.Quota}
}

// rolloutDelay is how long a delivery of a capability this worker lacks,
// but the catalog lists, is left for a worker that serves it, at its
// deliveries-th delivery: 100 ms at the first, twice as long at each next,
// at most most. The first is short: a worker that serves it may already be
// pulling from the same consumer (a new worker of the same pool); the growth
// keeps a fleet of older workers from passing a request around while no new
// one is there to take it.
func rolloutDelay(most time.Duration, deliveries int) time.Duration {
	return min(doubled(100*time.Millisecond, deliveries, 16), most)
}

// execute begins the delivery as an execution of this worker, of the
// capability c (nil: none served here; missing says why), and claims it.
func (d *delivery) execute(c Definition) Action {
	w, x := d.w, &d.x
	if w.base.Err() != nil || w.draining.Load() {
		// Shutting down: leave it to a live worker rather than claim it;
		// begun while draining, it could outlast the grace and be
		// abandoned mid-attempt.
		return Action{Do: Wait}
	}
	if !w.cfg.DisableLeaseRenewal && (x.meta.Stored.IsZero() || w.now().Sub(x.meta.Stored) >= w.cfg.Lease/10) {
		// The delivery may have waited in the pull buffer: restart its ack
		// timer now, as the claim starts its lease. (A message stored less
		// than a tenth of the lease ago cannot have waited longer: its ack
		// timer has nearly all its length left, and the lease keeper's first
		// InProgress comes well before it runs out.)
		_ = d.msg.InProgress()
	}
	if d.begun = x.begin(c, d.msg); !d.begun {
		return Action{Do: Wait, Delay: w.cfg.Lease}
	}
	return d.claimNew()
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
func (d *delivery) claimNew() Action {
	x := &d.x
	x.hashInput()
	facts := x.meta.facts(d.w.windows(), d.w.now())
	if x.cap != nil && x.req.ApprovalID == "" && x.cap.Unclaimed() {
		return d.runUnclaimed(facts)
	}
	if x.cap != nil && x.req.ApprovalID == "" && facts.FirstRecent {
		// The short path: the request's first delivery, not a resume, of a
		// capability served here, with an id made within the record window.
		x.trail.hold()
		x.unaudited = true
		return Action{Do: Run}
	}
	rec := x.newRecord(StateClaimed)
	if x.unproven = !facts.AbsenceProves; x.unproven {
		// Should this claim be lost before it decides, the takeover of its
		// record must not take it for one of a request that never ran.
		rec.LastError = envelope.CodeWorkerLost
	}
	if !x.create(rec) {
		return x.yield()
	}
	if r := x.claim.held(); r.Claim != x.claim.token || r.State != StateClaimed {
		// Our own create, whose answer was lost, already moved on: not here.
		return x.yield()
	}
	x.unaudited = true
	f := x.facts(nil, EnvelopeNotRead)
	f.Claimed = true
	if !f.FirstRecent {
		f.Envelope = x.readEnvelope()
	}
	return Takeover(f)
}

// runUnclaimed begins a read that needs no claim (Definition.Unclaimed,
// DESIGN §14 "Reads without claims"): nothing is written before its
// envelope. A delivery that may not be the request's first (a
// redelivery, an id older than the record window, a later publication of
// the id: without a record, only the envelope tells that it ended), or
// whose execution a cancel notice named while it waited, reads the record
// first: one found — a caller's cancel of the queued request, a claim of a
// worker that did not know the capability for a read — decides as the
// takeover table says; then the envelope: one there is a duplicate. A first
// delivery reads nothing: a cancel recorded while the request waited, which
// its worker did not hear of (it started after the cancel), does not stop
// it. A run lost with its worker runs again at the redelivery.
func (d *delivery) runUnclaimed(f Facts) Action {
	x := &d.x
	first := f.FirstRecent && !laterPublication(x.req.ExecutionID, x.meta.Stored, d.w.windows().Record)
	if !first || d.w.inflight.wasNoticed(x.key) {
		rec, rev, err := x.w.store.load(x.key)
		switch {
		case err == nil:
			x.found, x.foundRev = rec, rev
			return Takeover(x.facts(rec, x.readEnvelope()))
		case !errors.Is(err, broker.ErrNotFound):
			return Action{Do: Wait, Delay: time.Second} // the store did not answer: decide again later
		}
	}
	if !first {
		switch ended, err := d.endedBefore(); {
		case ended:
			ackSync(d.msg)
			return Action{}
		case err != nil:
			return Action{Do: Wait, Delay: time.Second}
		}
	}
	// Its first events wait for its end, as the short path's do: a put-back
	// (an operator's pause) files nothing.
	x.trail.hold()
	x.unclaimed, x.unaudited, x.lease.unclaimed = true, true, true
	return Action{Do: Run}
}

// takeOver takes the record found, another claim's whose lease ran out (or
// a cancel's), by compare-and-swap, audits it, and returns the action that
// follows once the swap holds it: a cancel recorded meanwhile ends it
// (Action.AfterTakeover).
func (d *delivery) takeOver(a Action) Action {
	w, x := d.w, &d.x
	rec, rev := x.found, x.foundRev
	x.found = nil
	from, prev := rec.Worker, rec.State
	x.claim.hold(rec, rev)
	endClaim := x.stage(observe.StageClaim)
	err := x.claim.update(func(r *Record) {
		r.Worker, r.Claim = w.cfg.ID, x.claim.token
		r.LeaseUntil = w.now().UTC().Add(w.cfg.Lease)
		if r.State == StatePending {
			// A cancel's record knew only the id.
			r.State = StateClaimed
			claimedFor(r, x.req, x.inputHash)
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
		x.claim.drop()
		return Action{Do: Wait, Delay: time.Second}
	}
	switch {
	case prev == StatePending:
		// A cancel came first and left the record; the request itself was
		// never audited.
		x.emit(audit.EventRequested, nil)
	case from == "":
		// Left waiting for a limit (capability.limited is in the trail) by
		// a worker that gave it back: resumed, not taken over.
	default:
		w.stats.takenOver.Add(1)
		x.obs.TakenOver(string(prev))
		x.emit(audit.EventTakenOver, map[string]any{"fromWorker": from, "state": string(prev), "attempt": rec.Attempt})
	}
	a = a.AfterTakeover(x.claim.held())
	a.TakeOver = false
	return a
}

// endNotStarted ends a delivery whose request is past its start deadline
// and has no record (EndNotStarted): NOT_STARTED, its record finalized
// first. A delivery of a request that has ended already is a duplicate. A
// record found in the way is claimed as any other (Claim), and the takeover
// table decides from it.
func (d *delivery) endNotStarted() Action {
	switch ended, err := d.endedBefore(); {
	case ended:
		ackSync(d.msg)
		return Action{}
	case err != nil:
		return Action{Do: Wait, Delay: time.Second} // the store did not answer: decide again later
	}
	d.x.hashInput()
	done, found, _ := d.x.endUnrun(notStartedEnvelope(d.x.req), "")
	switch {
	case done:
		d.w.stats.notStarted.Add(1)
		ackSync(d.msg)
		return Action{}
	case found != nil:
		return Action{Do: Claim}
	}
	return Action{Do: Wait, Delay: time.Second} // the store did not answer: decide again later
}

// refuse ends a request that must never run (Refuse) with a.Err, without
// running it, and settles the delivery once its envelope exists:
// terminated, or acknowledged. An id that is no execution id ends nothing:
// the message is terminated at once.
//
// A message that leaves the work-queue stream before its envelope is
// written is never finalized (DESIGN §13). An envelope already there is a
// duplicate delivery. A record found in the way decides as the takeover
// table says (a cancel's pending record: CANCELLED; a finalized one: the
// envelope it stands for); any other record is another delivery's claim,
// waited for with a delay.
func (d *delivery) refuse(a Action) Action {
	x := &d.x
	if envelope.ValidExecutionID(x.req.ExecutionID) == nil {
		switch ended, err := d.endedBefore(); {
		case err != nil:
			return Action{Do: Wait, Delay: time.Second}
		case !ended:
			env := &envelope.Envelope{ExecutionID: x.req.ExecutionID, CapabilityID: x.req.CapabilityID, Status: envelope.StatusFailed,
				Error: a.Err.Wire()}
			done, rec, rev := x.endUnrun(env, a.Reason)
			switch {
			case done:
			case rec != nil && (rec.State == StatePending || rec.State == StateFinalized):
				// Decided as a delivery of an unknown capability that
				// found it.
				if d.begun = x.begin(nil, d.msg); !d.begun {
					return Action{Do: Wait, Delay: d.w.cfg.Lease}
				}
				x.hashInput()
				x.found, x.foundRev = rec, rev
				return Takeover(x.facts(rec, x.readEnvelope()))
			case rec != nil:
				return Action{Do: Wait, Delay: max(rec.LeaseUntil.Sub(d.w.now()), time.Second)}
			default:
				return Action{Do: Wait, Delay: time.Second} // the store did not answer: decide again later
			}
		}
	}
	if a.term != "" {
		_ = d.msg.TermWithReason(a.term)
	} else {
		ackSync(d.msg)
	}
	return Action{}
}

// endedBefore reports whether the execution has its envelope already (one
// that does not decode counts: only a finalization writes there), and then
// audits the delivery as a duplicate. An error: the store did not answer.
func (d *delivery) endedBefore() (bool, error) {
	have, err := d.x.envelope()
	if have == nil && !errors.Is(err, envelope.ErrDecode) {
		return false, err
	}
	finalizedBy := ""
	if have != nil {
		finalizedBy = have.FinalizedBy
	}
	d.w.duplicate(d.x.principal, d.x.req, map[string]any{"finalizedBy": finalizedBy})
	return true, nil
}

// duplicate acknowledges a delivery of an execution that has ended
// (Duplicate): never a new attempt. The record found, or this delivery's
// claim, names who finalized it.
func (d *delivery) duplicate() Action {
	d.x.lease.halt()
	by := d.x.found
	if by == nil {
		by = d.x.claim.held()
	}
	d.w.duplicate(d.x.principal, d.x.req, map[string]any{"finalizedBy": by.Worker})
	ackSync(d.msg)
	return Action{}
}

// restore writes the envelope the finalized record found stands for
// (RestoreEnvelope), then acknowledges the delivery as a duplicate; the
// next delivery tries again when it could not.
func (d *delivery) restore() Action {
	if !d.x.endRecorded(d.x.found) {
		return Action{Do: Wait, Delay: time.Second}
	}
	return d.duplicate()
}

// conflict acks, without running it, a request whose execution's record was
// claimed for another request under the same id (Conflict; Record.Conflict
// names the field that differs), and audits it as a duplicate delivery with
// the field and the record's capability. Nothing of the execution changes:
// the request the record names still decides it.
func (d *delivery) conflict(field string) Action {
	rec, req := d.x.found, d.x.req
	d.w.log.Warn("a request differs from the one its execution was claimed for: acknowledged, not run",
		"executionId", req.ExecutionID, "capabilityId", req.CapabilityID, "field", field)
	d.w.duplicate(d.x.principal, d.x.req, map[string]any{"conflict": field, "claimedFor": rec.CapabilityID, "claimedBy": rec.Worker})
	ackSync(d.msg)
	return Action{}
}

// refuseExpired ends a request whose id is older than envelopes are kept
// (RefuseExpired): terminated, audited execution.expired_request, no
// envelope (its caller's await answers EXPIRED).
func (d *delivery) refuseExpired() Action {
	x := &d.x
	made, _ := envelope.ExecutionIDTime(x.req.ExecutionID)
	x.lease.halt()
	d.w.log.Warn("request older than the envelope retention: refused", "executionId", x.req.ExecutionID,
		"idTime", made, "retention", d.w.envelopeRetention())
	x.emit(audit.EventExpiredRequest, map[string]any{"idTime": made.UTC().Format(time.RFC3339Nano),
		"envelopeRetention": d.w.envelopeRetention().String()})
	_ = d.msg.TermWithReason("request older than the envelope retention")
	return Action{}
}

// notFound ends an execution of a capability no pool serves (NotFound):
// CAPABILITY_NOT_FOUND, denied for the reason missing says.
func (d *delivery) notFound() Action {
	x := &d.x
	x.audited()
	near := ""
	if f := d.w.cfg.NearName; f != nil {
		near = f(x.principal, x.req)
	}
	cerr := NotFoundNear(near)
	x.emit(audit.EventDenied, map[string]any{"reason": x.missing, "publicCode": string(cerr.Code), "stage": cerr.Stage})
	return Action{Do: Finish, end: failed(cerr)}
}

// awaitApproval ends a call that needs an approval (AwaitApproval, stage
// 8): claimed first (the short path runs stages 4 to 9 before its claim,
// and the approval is a write), the approval's id reserved on the record,
// so that a takeover of this execution finds the same approval instead of
// asking twice, the approval stored, then the envelope approval-required.
// When another record was in the way of the claim, the takeover table
// decides from it.
func (d *delivery) awaitApproval(need *ApprovalNeeded) Action {
	x := &d.x
	defer x.stage(observe.StageApproval)(nil)
	if x.claim.held() == nil {
		// A read asked to wait for an approval (a policy's) is claimed
		// from here on, as any other call.
		x.unclaimed, x.lease.unclaimed = false, false
		if !x.create(x.newRecord(StateClaimed)) {
			return x.yield()
		}
		x.trail.flush()
		x.lease.start()
	}
	id := x.claim.record().ApprovalID
	if id == "" {
		id = envelope.NewExecutionID()
		if err := x.claim.update(func(r *Record) { r.ApprovalID = id }); err != nil {
			return x.endByRecord(err, 0)
		}
	}
	ctx, cancel := StoreContext()
	defer cancel()
	ref, data, cerr := need.Store(ctx, id)
	if cerr != nil {
		return d.finalize(failed(cerr), 0)
	}
	return d.finalize(approvalRequired(ref, data), 0)
}

// finalize is stage 14: the execution writes its end (execution.end), then
// the delivery is acknowledged.
func (d *delivery) finalize(o *outcome, attempts int) Action {
	next, written := d.x.end(o, attempts)
	if written {
		// A lost ack is a redelivery, which finds the envelope: no need to wait.
		_ = d.msg.Ack()
	}
	return next
}

// wait leaves the delivery for a later one (Wait): after a.Delay, when it
// holds no claim. A claim it holds is given back first, its lease ended
// now: for a limit, its record names no worker meanwhile and the delivery
// comes back after a.Delay; otherwise it comes back at once.
func (d *delivery) wait(a Action) Action {
	if d.x.claim.held() != nil && !a.limit {
		return d.release()
	}
	d.giveBack(a.limit, func() { nak(d.msg, a.Delay) })
	return Action{}
}

// release gives the execution back (Release): the lease ends now and the
// message is redelivered at once, so a live worker takes it over.
func (d *delivery) release() Action {
	d.giveBack(false, func() { _ = d.msg.Nak() })
	return Action{}
}

// giveBack gives the execution back, its lease ended now, and then has the
// delivery redelivered as redeliver says; nothing claimed yet, the held
// trail is dropped first. A claim another worker took keeps its delivery.
// Waiting (for a limit), the record names no worker any more: the delivery
// that comes back resumes it rather than taking it over from a worker that
// was not lost.
func (d *delivery) giveBack(waiting bool, redeliver func()) {
	x := &d.x
	if x.claim.held() == nil {
		x.trail.drop()
		redeliver()
		return
	}
	x.lease.halt()
	if err := x.claim.update(func(r *Record) {
		r.LeaseUntil = d.w.now().UTC()
		if waiting {
			r.Worker = ""
		}
	}); errors.Is(err, errLost) {
		return // another worker owns it, and its delivery
	}
	redeliver()
}
