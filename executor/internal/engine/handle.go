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

// decode reads a delivery's request and the principal its subject names (an
// open server's requests are the anonymous principal's); a message that is
// no request is terminated here.
func (r *Runner) decode(msg jetstream.Msg) (*envelope.Request, string, bool) {
	req, err := envelope.DecodeRequest(msg.Data())
	if err != nil {
		r.undecodable(msg, err)
		return nil, "", false
	}
	principal := r.principalOf(msg)
	if id := msgID(msg); !broker.MsgIDNames(id, principal, req.ExecutionID) {
		// Message ids are scoped by principal (DESIGN §2): one that names
		// another execution is a forgery or a broken client. Refused before
		// anything of it runs; its own execution, if nothing else ends it,
		// ends INPUT_INVALID.
		r.refuseUnrun(msg, principal, req.ExecutionID, req.CapabilityID,
			"The request's message id does not name its execution.", "misnamed",
			"request's message id does not name its execution: refused", "msgId", id)
		return nil, "", false
	}
	return req, principal, true
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

// handle decides what one delivery means (DESIGN §5) and acts on it.
func (r *Runner) handle(msg jetstream.Msg) {
	req, principal, ok := r.decode(msg)
	if !ok {
		return
	}
	if x := r.local(broker.Key(principal, req.ExecutionID)); x != nil {
		// A redelivery while this worker still runs the execution: the running
		// delivery's ack settles the message.
		nak(msg, r.cfg.Lease)
		return
	}
	d := delivered(msg, req)
	if r.endedUnstarted(msg, principal, req, d) {
		return
	}
	if share := r.share.Load(); share != nil {
		if !share.take(principal, r.now()) {
			// Over its principal's fair share while others wait: nothing of
			// it was read or written; a later delivery runs it.
			r.deferred.Add(1)
			nak(msg, shareDelay())
			return
		}
		defer share.give(principal)
	}
	c := r.cfg.Capabilities[req.CapabilityID]
	missing := ""
	if c == nil {
		// During a rolling deploy a newer worker may serve it: wait while the
		// catalog lists it.
		switch listed, err := r.cfg.Listed(req.CapabilityID); {
		case err != nil:
			nak(msg, time.Second) // the store did not answer: decide again later
			return
		case listed && envelope.ValidCapabilityID(req.CapabilityID) == nil:
			nak(msg, rolloutDelay(r.cfg.RolloutDelay, d.Deliveries))
			return
		}
		missing = "unknown"
	}
	r.execute(msg, req, d, c, missing)
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

// execute runs one delivery as an execution of this worker. A nil
// capability (missing says why) finalizes it CAPABILITY_NOT_FOUND, unless
// its record says otherwise: even then the takeover table decides.
func (r *Runner) execute(msg jetstream.Msg, req *envelope.Request, d Delivery, c Definition, missing string) {
	if r.base.Err() != nil {
		// Shutting down: leave it to a live worker rather than claim it.
		nak(msg, 0)
		return
	}
	if !r.cfg.DisableLeaseRenewal && (d.Stored.IsZero() || r.now().Sub(d.Stored) >= r.cfg.Lease/10) {
		// The delivery may have waited in the pull buffer: restart its ack
		// timer now, as the claim starts its lease. (A message stored less
		// than a tenth of the lease ago cannot have waited longer: its ack
		// timer has nearly all its length left, and the lease keeper's first
		// InProgress comes well before it runs out.)
		_ = msg.InProgress()
	}
	x := r.newExecution(msg, req, d, c)
	x.missing = missing
	if !r.start(msg, x) {
		return
	}
	defer r.untrack(x)
	defer x.finish()
	x.claimAndRun()
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
func (e *Execution) claimAndRun() {
	e.hashInput()
	if e.shortPath() {
		e.trail.hold()
		e.run(true, 0, "")
		return
	}
	rec := e.newRecord(StateClaimed)
	if e.unproven = !e.delivery.facts(e.r.windows(), e.r.now()).AbsenceProves; e.unproven {
		// Should this claim be lost before it decides, the takeover of its
		// record must not take it for one of a request that never ran.
		rec.LastError = envelope.CodeWorkerLost
	}
	if !e.create(rec) {
		e.yieldClaim()
		return
	}
	if r := e.claim.held(); r.Claim != e.claim.token || r.State != StateClaimed {
		// Our own create, whose answer was lost, already moved on: not here.
		e.yieldClaim()
		return
	}
	if !e.checkedFresh() {
		return
	}
	e.runClaimed()
}

// shortPath reports whether this delivery may run stages 4 to 9 before its
// claim: the request's first delivery, not a resume, of a capability served
// here, with an id made within the record window.
func (e *Execution) shortPath() bool {
	return e.cap != nil && e.req.ApprovalID == "" && e.delivery.facts(e.r.windows(), e.r.now()).FirstRecent
}

// yieldClaim ends a claim that did not happen: the record found decides
// (DESIGN §5), or, when the store did not answer, a later delivery does.
func (e *Execution) yieldClaim() {
	e.trail.drop()
	if e.found != nil {
		rec, rev := e.found, e.foundRev
		e.found = nil
		e.decide(rec, rev)
		return
	}
	nak(e.msg, time.Second)
}

// claimBeforeWrite claims an execution that runs stages 4 to 9 before its
// claim (the short path), ahead of a write (the approval gate's), and
// reports whether it may go on. When it may not, the record found has
// decided (the takeover table) and the caller returns without finalizing.
func (e *Execution) claimBeforeWrite() bool {
	if e.claim.held() != nil {
		return true
	}
	if !e.create(e.newRecord(StateClaimed)) {
		e.yieldClaim()
		return false
	}
	e.trail.flush()
	e.lease.start()
	return true
}

// checkedFresh decides an execution this delivery has just claimed with no
// record before it (see claimAndRun), from the takeover table's rows of a
// missing record: unless the delivery proves the execution new (a recent
// id's first delivery), it reads the envelope first. It reports whether the
// execution may run.
func (e *Execution) checkedFresh() bool {
	f := e.facts(nil, EnvelopeNotRead)
	f.Claimed = true
	if !f.FirstRecent {
		f.Envelope = e.readEnvelope()
	}
	a := Takeover(f)
	switch a.Do {
	case Run:
		return true
	case Duplicate:
		e.lease.halt()
		e.r.duplicate(e.msg, e.principal, e.req, e.claim.held().Worker)
	case Wait:
		e.release()
	case RefuseExpired:
		made, _ := envelope.ExecutionIDTime(e.req.ExecutionID)
		e.refuseExpired(made)
	case Fail:
		e.emit(audit.EventRequested, nil)
		e.finalize(afterRun(a.Err), a.Attempts)
	}
	return false
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

// refuseExpired ends a request whose id is older than envelopes are kept:
// terminated, audited execution.expired_request, no envelope (its caller's
// await answers EXPIRED).
func (e *Execution) refuseExpired(made time.Time) {
	e.lease.halt()
	e.r.log.Warn("request older than the envelope retention: refused", "executionId", e.req.ExecutionID,
		"idTime", made, "retention", e.r.envelopeRetention())
	e.emit(audit.EventExpiredRequest, map[string]any{"idTime": made.UTC().Format(time.RFC3339Nano),
		"envelopeRetention": e.r.envelopeRetention().String()})
	_ = e.msg.TermWithReason("request older than the envelope retention")
}

// runClaimed runs an execution this delivery has just claimed.
func (e *Execution) runClaimed() {
	if e.cap == nil {
		e.notFound(true)
		return
	}
	e.run(true, 0, "")
}

// decide handles a delivery whose execution already has a record: the
// takeover table of DESIGN §5 (Takeover) decides, this carries it out.
func (e *Execution) decide(rec *Record, rev uint64) {
	a := Takeover(e.facts(rec, e.readEnvelope()))
	if !a.TakeOver {
		switch a.Do {
		case Duplicate:
			e.r.duplicate(e.msg, e.principal, e.req, rec.Worker)
		case RestoreEnvelope:
			if !e.r.finalizeRecorded(e, rec) {
				// The next delivery tries again.
				nak(e.msg, time.Second)
				return
			}
			e.r.duplicate(e.msg, e.principal, e.req, rec.Worker)
		case Conflict:
			e.r.conflict(e.msg, e.principal, e.req, rec, a.Field)
		case Wait:
			nak(e.msg, a.Delay)
		}
		return
	}
	from := rec.Worker
	prev := rec.State
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
		nak(e.msg, time.Second)
		return
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
	switch a = a.AfterTakeover(e.claim.held()); a.Do {
	case Cancel:
		e.finalize(cancelled(envelope.CodeCancelled, "The caller cancelled the execution."), a.Attempts)
	case Recover:
		e.recoverTaken(a.Attempts)
	case Reconcile:
		e.reconcile(a.Attempts)
	case Retry:
		e.retryReason = a.Reason
		e.run(false, a.Attempts, envelope.CodeWorkerLost)
	case Fail:
		e.finalize(afterRun(a.Err), a.Attempts)
	case NotStarted:
		e.r.notStarted.Add(1)
		e.finalize(failed(NotStartedError()), 0)
	case NotFound:
		e.notFound(false)
	case Run:
		e.run(false, 0, "")
	}
}

// notFound finalizes an execution of a capability no pool serves.
func (e *Execution) notFound(fresh bool) {
	if fresh {
		e.emit(audit.EventRequested, nil)
	}
	near := ""
	if f := e.r.cfg.NearName; f != nil {
		near = f(e.principal, e.req)
	}
	cerr := NotFoundNear(near)
	e.emit(audit.EventDenied, map[string]any{"reason": e.missing, "publicCode": string(cerr.Code), "stage": cerr.Stage})
	e.finalize(failed(cerr), 0)
}

// duplicate acknowledges a delivery of an execution that is already finalized:
// never a new attempt.
func (r *Runner) duplicate(msg jetstream.Msg, principal string, req *envelope.Request, finalizedBy string) {
	r.auditDuplicate(principal, req, map[string]any{"finalizedBy": finalizedBy})
	ackSync(msg)
}

// auditDuplicate audits a delivery that runs nothing (an execution already
// finalized, a request its execution was not claimed for) with data:
// execution.duplicate_delivery, never a second call.
func (r *Runner) auditDuplicate(principal string, req *envelope.Request, data map[string]any) {
	r.duplicates.Add(1)
	r.emit(&audit.Event{Type: audit.EventDuplicateDelivery, Surface: req.Surface, Actor: audit.ActorOf(req.Actor),
		Principal: principal, ExecutionID: req.ExecutionID, CapabilityID: req.CapabilityID, CorrelationID: req.CorrelationID,
		TraceID: audit.TraceID(req.Traceparent), Data: data})
}

// undecodable terminates a message that is not a request: it must not be
// redelivered forever. With a usable execution id in its message id, it is
// finalized as INPUT_INVALID so that its caller is not left waiting.
func (r *Runner) undecodable(msg jetstream.Msg, derr error) {
	principal := r.principalOf(msg)
	r.refuseUnrun(msg, principal, broker.ExecutionOfMsgID(msgID(msg), principal),
		r.b.Names.CapabilityFromSubject(msg.Subject()), "The request could not be decoded.", "undecodable",
		"request does not decode: terminated", "err", derr)
}

// refuseUnrun ends a delivery that must never run (a message that is no
// request, or whose message id names another execution), logging why with
// logAttrs: when id is a usable execution id, its execution is finalized
// INPUT_INVALID with message, unless something else ended it; the message is
// terminated once that is so.
func (r *Runner) refuseUnrun(msg jetstream.Msg, principal, id, capID, message, reason, logMsg string, logAttrs ...any) {
	r.log.Warn(logMsg, append([]any{"subject", msg.Subject(), "executionId", id}, logAttrs...)...)
	if envelope.ValidExecutionID(id) == nil {
		env := inputInvalid(id, capID, message)
		e := r.bare(msg, &envelope.Request{ExecutionID: id, CapabilityID: capID}, principal)
		if !r.endWithoutRun(msg, e, env, reason) {
			return // its envelope is not written yet: not terminated
		}
	}
	_ = msg.TermWithReason(logMsg)
}

// inputInvalid is the envelope of a request refused as no request at all.
func inputInvalid(id, capID, message string) *envelope.Envelope {
	return &envelope.Envelope{ExecutionID: id, CapabilityID: capID, Status: envelope.StatusFailed,
		Error: &envelope.Error{Code: envelope.CodeInputInvalid, Stage: envelope.StageInput, ExposeToModel: true,
			Message: message}}
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
func (r *Runner) endWithoutRun(msg jetstream.Msg, e *Execution, env *envelope.Envelope, reason string) bool {
	switch ended, err := r.endedBefore(e); {
	case ended:
		return true
	case err != nil:
		nak(msg, time.Second)
		return false
	}
	done, rec, rev := r.finalizeWithoutRun(e, env, reason)
	switch {
	case done:
		return true
	case rec != nil && (rec.State == StatePending || rec.State == StateFinalized):
		// decide settles the delivery itself.
		r.decideFound(msg, e.req, rec, rev)
	case rec != nil:
		nak(msg, max(rec.LeaseUntil.Sub(r.now()), time.Second))
	default:
		nak(msg, time.Second) // the store did not answer: decide again later
	}
	return false
}

// endedBefore reports whether x's execution has its envelope already (one
// that does not decode counts: only a finalization writes there), and then
// audits the delivery as a duplicate. An error: the store did not answer.
func (r *Runner) endedBefore(e *Execution) (bool, error) {
	have, err := e.envelope()
	if have == nil && !errors.Is(err, envelope.ErrDecode) {
		return false, err
	}
	finalizedBy := ""
	if have != nil {
		finalizedBy = have.FinalizedBy
	}
	r.auditDuplicate(e.principal, e.req, map[string]any{"finalizedBy": finalizedBy})
	return true, nil
}

// decideFound lets the takeover table decide a delivery of a request that
// was not claimed from the record found in its place.
func (r *Runner) decideFound(msg jetstream.Msg, req *envelope.Request, rec *Record, rev uint64) {
	x := r.newExecution(msg, req, delivered(msg, req), nil)
	if !r.start(msg, x) {
		return
	}
	defer r.untrack(x)
	defer x.finish()
	x.hashInput()
	x.decide(rec, rev)
}

// handleUnrouted serves the _unrouted consumer: requests a producer sent there
// because its catalog did not list the capability.
func (r *Runner) handleUnrouted(msg jetstream.Msg) {
	req, principal, ok := r.decode(msg)
	if !ok {
		return
	}
	d := delivered(msg, req)
	if r.endedUnstarted(msg, principal, req, d) {
		return
	}
	fwd := msg.Data()
	if req.ApprovalID != "" && req.CapabilityID == "" && r.cfg.ResolveResume != nil {
		// A resume naming only its approval: the approval says the rest.
		ctx, cancel := StoreContext()
		err := r.cfg.ResolveResume(ctx, principal, req)
		cancel()
		var cerr *envelope.CapabilityError
		if err != nil && !errors.As(err, &cerr) {
			r.log.Warn("resume not resolved; delivery left for later", "executionId", req.ExecutionID, "err", err)
			nak(msg, time.Second)
			return
		}
		if cerr != nil {
			x := r.bare(msg, req, principal)
			env := &envelope.Envelope{ExecutionID: req.ExecutionID, CapabilityID: req.CapabilityID, Status: envelope.StatusFailed,
				Error: &envelope.Error{Code: cerr.Code, Stage: cerr.Stage, ExposeToModel: cerr.ExposeToModel, Message: cerr.Message}}
			reason := "resume-refused"
			if cerr.Cause != nil {
				reason += ": " + cerr.Cause.Error()
			}
			if r.endWithoutRun(msg, x, env, reason) {
				ackSync(msg)
			}
			return
		}
		if fwd, err = envelope.Marshal(req); err != nil {
			nak(msg, time.Second)
			return
		}
	}
	listed, err := r.cfg.Listed(req.CapabilityID)
	if err != nil {
		nak(msg, time.Second) // the store did not answer: decide again later
		return
	}
	if listed && envelope.ValidCapabilityID(req.CapabilityID) == nil {
		// The producer's catalog was stale: forward under a distinct message id,
		// since the original id is still in the dedup window. The principal
		// stays the one the server authenticated.
		ctx, cancel := StoreContext()
		defer cancel()
		if _, err := r.b.JS.Publish(ctx, r.b.Names.ExecSubject(principal, req.CapabilityID), fwd,
			jetstream.WithMsgID(r.ids.Forward(principal, req.ExecutionID))); err != nil {
			if full := broker.AsQueueFull(err); full != nil {
				// The principal's queue, which holds this request too, is
				// full: the forward would wait on the principal's own
				// backlog for ever. Refused now, as its publication
				// would have been.
				r.refuseFull(msg, req, principal, full)
				return
			}
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
	r.execute(msg, req, d, nil, missing)
}

// refuseFull ends a request from the unrouted subject whose forward its
// principal's full queue refused: QUOTA_EXCEEDED with the queue's limit,
// nothing run (DESIGN §12 "Quotas").
func (r *Runner) refuseFull(msg jetstream.Msg, req *envelope.Request, principal string, full *broker.QueueFullError) {
	limit := int64(-1)
	ctx, cancel := StoreContext()
	if u, err := r.b.QueueUsageOf(ctx, principal); err == nil {
		limit = u.Limit(full.Quota)
	}
	cancel()
	cerr := full.QuotaError(limit)
	r.cfg.Observer.QuotaExceeded(full.Quota, principal)
	env := &envelope.Envelope{ExecutionID: req.ExecutionID, CapabilityID: req.CapabilityID, Status: envelope.StatusFailed, Error: cerr.Wire()}
	if r.endWithoutRun(msg, r.bare(msg, req, principal), env, "quota: "+full.Quota) {
		ackSync(msg)
	}
}

// endedUnstarted ends a delivery whose request is past its start deadline
// and has no record, and reports whether it did; a request with a record is
// left to the takeover table. A delivery of a request that has ended already
// is a duplicate. When finding no record would not prove that the request
// never started (AbsenceProves: an attempt may have run under a record that
// has expired since), it is not said to have never run: the claiming path
// decides (checkedFresh).
func (r *Runner) endedUnstarted(msg jetstream.Msg, principal string, req *envelope.Request, d Delivery) bool {
	if Takeover(d.facts(r.windows(), r.now())).Do != EndNotStarted {
		return false
	}
	x := r.bare(msg, req, principal)
	switch ended, err := r.endedBefore(x); {
	case ended:
		ackSync(msg)
		return true
	case err != nil:
		nak(msg, time.Second) // the store did not answer: decide again later
		return true
	}
	x.hashInput()
	done, found, _ := r.finalizeWithoutRun(x, notStartedEnvelope(req), "")
	switch {
	case done:
		r.notStarted.Add(1)
		ackSync(msg)
	case found != nil:
		return false
	default:
		nak(msg, time.Second) // the store did not answer: decide again later
	}
	return true
}

// conflict acks, without running it, a request whose execution's record was
// claimed for another request under the same id (Record.Conflict names the
// field that differs), and audits it as a duplicate delivery with the field
// and the record's capability. Nothing of the execution changes: the request
// the record names still decides it.
func (r *Runner) conflict(msg jetstream.Msg, principal string, req *envelope.Request, rec *Record, field string) {
	r.log.Warn("a request differs from the one its execution was claimed for: acknowledged, not run",
		"executionId", req.ExecutionID, "capabilityId", req.CapabilityID, "field", field)
	r.auditDuplicate(principal, req, map[string]any{"conflict": field, "claimedFor": rec.CapabilityID, "claimedBy": rec.Worker})
	ackSync(msg)
}
