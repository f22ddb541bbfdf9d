package engine

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/auditemit"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/observe"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
)

// execution is one execution as a delivery works on it: who asked for
// what, and what the engine holds for it — its claim on the record, the
// lease keeper, the trail, the observer's view, the context its attempts
// run under. The delivery's pass, its attempts and its receipts share it;
// it calls none of them. It writes its own end (finalize.go).
type execution struct {
	w   *worker
	req *envelope.Request
	// principal is the token of the subject the server accepted the request
	// on: who sent it, whatever the body says. key is the execution's key in
	// the executions and envelopes buckets.
	principal, key string
	// subjectCapability is the capability id of the subject, "" for _unrouted.
	subjectCapability string
	cap               Definition // nil when no pool serves the capability
	// missing says why cap is nil: "unknown", "invalid-id".
	missing string
	// meta is what the message's metadata says of this delivery.
	meta Delivery
	// unproven: this delivery found no record, and that did not prove that
	// no attempt had started (AbsenceProves).
	unproven bool
	// unaudited: this delivery claimed the execution fresh and has not
	// filed its capability.requested yet (audited).
	unaudited bool
	// unclaimed: a read run without a claim (delivery.runUnclaimed): no
	// record is written for it.
	unclaimed bool
	obs       observe.Execution

	// ctx spans the whole execution: the caller's cancel and deadline, a lost
	// claim, the worker's shutdown. Each attempt adds its own timeout.
	ctx          context.Context
	cancel       context.CancelCauseFunc
	stopDeadline context.CancelFunc
	// held is ctx without the caller's cancel and deadline, or an
	// operator's: what ends the claim alone (its loss, the worker's
	// shutdown), even once a cancel ended ctx. It ends with the execution.
	held   context.Context
	unhold context.CancelCauseFunc

	// claim holds the execution's record; lease keeps it while it runs,
	// and takes what its attempts report of their progress; trail files its
	// audit events.
	claim claim
	lease leaseKeeper
	trail trail

	start     time.Time
	inputHash string
	done      chan struct{}

	// flight is its entry in the worker's table of executions in flight
	// (begin), where an operator's pause finds it.
	flight flight

	// found is the record a create of this delivery found in its place:
	// another claim's, or a cancel's. The takeover table decides from it.
	found    *Record
	foundRev uint64
}

// newExecution is an execution of req, delivered as d (zero: no delivery),
// under principal, by worker w, with its claim (not made yet) and its
// trail: what may end it without running it. begin makes it one that may
// run.
func newExecution(w *worker, req *envelope.Request, principal string, d Delivery) *execution {
	x := &execution{}
	x.prepare(w, req, principal, d)
	return x
}

// prepare makes x an execution of req (newExecution).
func (x *execution) prepare(w *worker, req *envelope.Request, principal string, d Delivery) {
	x.w, x.req, x.principal, x.key, x.meta = w, req, principal, broker.Key(principal, req.ExecutionID), d
	x.start, x.done, x.stopDeadline = w.now(), make(chan struct{}), func() {}
	x.trail.audit, x.trail.worker = w.audit, w.cfg.ID
	x.claim.s, x.claim.key, x.claim.token = w.store, x.key, uuid.NewString()
	x.lease.progress.x, x.lease.stop = x, make(chan struct{})
}

// begin makes the execution one of this worker, delivered by msg, of the
// capability c (nil: none served here): observed, with its context and
// lease keeper, in the table of executions in flight. An execution of the
// same key already in flight here keeps it: this one is finished, and
// begin reports false.
func (x *execution) begin(c Definition, msg jetstream.Msg) bool {
	w, req := x.w, x.req
	if _, capID, ok := w.b.Names.ParseExecSubject(msg.Subject()); ok && capID != broker.Unrouted {
		x.subjectCapability = capID
	}
	x.cap, x.start = c, w.now()
	ctx, obs := w.cfg.Observer.Begin(w.base, w.observed(x.meta, req, c != nil))
	x.obs = obs
	x.held = ctx
	if c != nil && c.Recovery().Reconciles {
		// Only a reconciler runs under the held context: no other
		// execution pays for it.
		x.held, x.unhold = context.WithCancelCause(ctx)
	}
	x.ctx, x.cancel = context.WithCancelCause(x.held)
	if req.Deadline != nil {
		x.ctx, x.stopDeadline = context.WithDeadlineCause(x.ctx, *req.Deadline, errDeadline)
	}
	l := &x.lease
	l.claim, l.length, l.disabled, l.now, l.msg = &x.claim, w.cfg.Lease, w.cfg.DisableLeaseRenewal, w.now, msg
	l.end, l.lost, l.done, l.log, l.id = x.cancel, x.cancel, x.done, w.log, req.ExecutionID
	if x.unhold != nil {
		l.lost = x.unhold
	}
	x.flight.cancel, x.flight.principal, x.flight.req = x.cancel, x.principal, req
	if !w.inflight.add(x.key, &x.flight) {
		x.finish()
		return false
	}
	return true
}

// finish ends the execution's observation, lease and context: its delivery
// is done with, whatever became of it.
func (x *execution) finish() {
	x.obs.End()
	close(x.done)
	x.lease.disarm()
	x.stopDeadline()
	x.cancel(nil)
	if x.unhold != nil {
		x.unhold(nil)
	}
}

// event is an audit event of the execution.
func (x *execution) event(typ string, data map[string]any) *audit.Event {
	return &audit.Event{
		Type: typ, Surface: x.req.Surface, Actor: audit.ActorOf(x.req.Actor), Principal: x.principal, ExecutionID: x.req.ExecutionID,
		CapabilityID: x.req.CapabilityID, CorrelationID: x.req.CorrelationID, InputHash: x.inputHash, Data: data,
		TraceID: auditemit.TraceID(x.req.Traceparent),
	}
}

// emit files an audit event of the execution.
func (x *execution) emit(typ string, data map[string]any) { x.trail.publish(x.event(typ, data)) }

// audited files stage 2's capability.requested of an execution this
// delivery claimed fresh, once, before anything else of it: the request is
// audited before anything can refuse it.
func (x *execution) audited() {
	if x.unaudited {
		x.unaudited = false
		x.emit(audit.EventRequested, nil)
	}
}

// stage tells the observer that a stage doing I/O starts (observe.Stage*);
// the returned func ends it.
func (x *execution) stage(name string) func(error) {
	_, end := x.obs.Stage(x.ctx, name)
	return end
}

// request is what the stages see of the execution.
func (x *execution) request() Request {
	r := Request{Request: x.req, Principal: x.principal, SubjectCapability: x.subjectCapability, Observer: x.obs}
	if rec := x.claim.held(); rec != nil {
		r.RecordCreated = rec.CreatedAt
	}
	return r
}

// idempotencyKey is the key the execution's attempts and reconciliations
// are given: the derivation its record names, fixed when the record was
// created (an execution begun by an earlier version keeps the id-alone key
// its record implies), and this version's before any record exists.
func (x *execution) idempotencyKey() string {
	if rec := x.claim.held(); rec != nil {
		return rec.IdempotencyKey(x.principal)
	}
	return envelope.IdempotencyKey(x.principal, x.req.ExecutionID)
}

// hashInput sets the input hash events carry in place of the input (SI-10).
func (x *execution) hashInput() {
	if h, err := envelope.InputHash(x.req.Input); err == nil {
		x.inputHash = h
	}
}

// newRecord is this delivery's first record of the execution, in state st.
func (x *execution) newRecord(st State) *Record {
	now := x.w.now().UTC()
	rec := &Record{
		V: envelope.Version, ExecutionID: x.req.ExecutionID,
		State: st, Worker: x.w.cfg.ID, Claim: x.claim.token, LeaseUntil: now.Add(x.w.cfg.Lease),
		CreatedAt: now, UpdatedAt: now, KeyVersion: envelope.IdempotencyKeyVersion,
	}
	claimedFor(rec, x.req, x.inputHash)
	return rec
}

// create writes the execution's first record, create-only (claim.create).
// It reports false when a record was there (x.found) or the store did not
// answer (x.found nil): yield says what follows.
func (x *execution) create(rec *Record) bool {
	var ok bool
	x.found, x.foundRev, ok = x.claim.create(rec, x)
	return ok
}

// yield ends a claim that did not happen: the record found decides (the
// takeover table), or, when the store did not answer, a later delivery
// does.
func (x *execution) yield() Action {
	x.trail.drop()
	x.unaudited = false
	if x.found == nil {
		return Action{Do: Wait, Delay: time.Second}
	}
	return Takeover(x.facts(x.found, x.readEnvelope()))
}

// lostWorker is the error of an attempt lost with its worker, as the retry
// rule is asked about it.
var lostWorker = &envelope.CapabilityError{Code: envelope.CodeWorkerLost, Stage: envelope.StageHandler, Retryable: true,
	Message: "The worker running the attempt was lost."}

// facts gathers what the takeover table decides from: the record found (nil:
// none), the envelope read, and this delivery's request and metadata.
func (x *execution) facts(rec *Record, read EnvelopeRead) Facts {
	f := x.meta.facts(x.w.windows(), x.w.now())
	f.Record, f.Envelope, f.Known, f.AbsenceProves = rec, read, x.cap != nil, !x.unproven
	if rec != nil {
		f.Conflict = conflict(rec, x.req, x.inputHash)
	}
	if c := x.cap; c != nil {
		f.Timeout = c.Timeout()
		f.Retry = func(n int) bool { _, ok := c.Retry(n, lostWorker); return ok }
		f.Recovery = c.Recovery()
	}
	f.IDExpired = func() bool {
		made, ok := envelope.ExecutionIDTime(x.req.ExecutionID)
		return ok && x.w.olderThanRetention(made)
	}
	return f
}

// envelope reads the execution's envelope: nil, nil when there is none.
func (x *execution) envelope() (*envelope.Envelope, error) { return x.w.store.envelope(x.key) }

// readEnvelope reads the execution's envelope for the takeover table.
func (x *execution) readEnvelope() EnvelopeRead {
	env, err := x.envelope()
	read := classifyEnvelope(env, err)
	switch read {
	case EnvelopeUndecodable:
		x.w.log.Error("stored envelope does not decode", "executionId", x.req.ExecutionID, "err", err)
	case EnvelopeUnknown:
		x.w.log.Warn("read envelope", "executionId", x.req.ExecutionID, "err", err)
	}
	return read
}

// endByRecord is how an execution whose record update failed ends: the
// caller's cancel, recorded meanwhile; otherwise the execution is left.
func (x *execution) endByRecord(err error, attempts int) Action {
	if errors.Is(err, errCancelRequested) {
		return Action{Do: Cancel, Attempts: attempts}
	}
	// Lost: another worker owns it. Unsettled: the store did not answer; the
	// redelivery decides once the lease has run out.
	x.w.log.Warn("execution record not updated: leaving the execution", "executionId", x.req.ExecutionID, "err", err)
	return Action{}
}

// trail files an execution's audit events (DESIGN §8). While it holds them,
// they are kept and published together, as one message: before the claim
// (they are dropped if the claim finds another record, whose execution has
// its own trail), and for a short while after the attempt starts, so that an
// execution that ends quickly is one message on the trail (DESIGN §14).
// Events reach the emitter under the trail's lock, so that they reach the
// stream in the order they were filed, whoever flushes.
type trail struct {
	audit  *auditemit.Emitter
	worker string

	mu      sync.Mutex
	held    []*audit.Event
	holding bool
	// soon: flushSoon queued the trail's flush (heldTrails); gen counts its
	// ends of holding, so that a flush queued for one holding does nothing
	// to another.
	soon bool
	gen  uint64
	// room holds a quick execution's events (requested, started, its
	// end) while they are held, without a slice grown for them.
	room [3]*audit.Event
}

// holdEvents is how long an attempt's first events wait for its end, to be
// published with it as one message.
const holdEvents = 20 * time.Millisecond

// publish files ev: kept while the trail holds its events, published at
// once otherwise.
func (t *trail) publish(ev *audit.Event) {
	ev.Worker = t.worker
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.holding {
		t.held = append(t.held, ev)
		return
	}
	t.audit.Emit(ev)
}

// hold starts keeping the events.
func (t *trail) hold() {
	t.mu.Lock()
	t.holding = true
	if t.held == nil {
		t.held = t.room[:0]
	}
	t.mu.Unlock()
}

// flush ends holding: what was kept is published as one message, then
// every later event at once.
func (t *trail) flush() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.flushLocked()
}

func (t *trail) flushLocked() {
	evs := t.held
	t.held, t.holding = nil, false
	t.gen++
	if len(evs) > 0 {
		t.audit.EmitAll(evs...)
	}
}

// flushHeld is flush, of the holding gen, queued by flushSoon: nothing once
// that holding ended.
func (t *trail) flushHeld(gen uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.holding && t.gen == gen {
		t.flushLocked()
	}
}

// flushSync is flush with ev added, acknowledged by JetStream before it
// returns (strict audit).
func (t *trail) flushSync(ctx context.Context, ev *audit.Event) error {
	ev.Worker = t.worker
	t.mu.Lock()
	defer t.mu.Unlock()
	evs := append(t.held, ev)
	t.held, t.holding = nil, false
	t.gen++
	return t.audit.EmitAllSync(ctx, evs...)
}

// drop forgets what is held: the claim found another record.
func (t *trail) drop() {
	t.mu.Lock()
	t.held, t.holding = nil, false
	t.gen++
	t.mu.Unlock()
}

// flushSoon publishes what is held after holdEvents, unless the execution
// ends first and publishes it with its terminal event.
func (t *trail) flushSoon() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.holding && !t.soon {
		t.soon = true
		heldTrails.add(heldTrail{t, t.gen})
	}
}

// heldTrails flushes the trails flushSoon queued, each holdEvents after: one
// timer for every execution's, none armed for each.
var heldTrails = dueQueue[heldTrail]{delay: holdEvents, fire: func(h heldTrail) { h.t.flushHeld(h.gen) }}

// heldTrail is a trail's holding gen, whose flush is queued.
type heldTrail struct {
	t   *trail
	gen uint64
}
