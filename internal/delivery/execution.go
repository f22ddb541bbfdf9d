package delivery

import (
	"context"
	"errors"
	"time"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/broker"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/observe"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
)

// Execution is one delivery of one request being worked on by this worker.
type Execution struct {
	w   *Runner
	msg jetstream.Msg
	req *envelope.Request
	// principal is the token of the subject the server accepted the request
	// on: who sent it, whatever the body says. key is the execution's key in
	// the executions and envelopes buckets.
	principal, key string
	// subjectCapability is the capability id of the subject, "" for _unrouted.
	subjectCapability string
	cap               Capability // nil when no pool serves the capability
	obs               observe.Execution
	// missing says why cap is nil: "unknown", "invalid-id".
	missing string
	// unproven: this delivery found no record, and that did not prove that
	// no attempt had started (absenceProves).
	unproven bool
	// unit runs the attempts, once stages 4 to 9 let the execution through.
	unit WorkUnit

	// ctx spans the whole execution: the caller's cancel and deadline, a lost
	// claim, the worker's shutdown. Each attempt adds its own timeout.
	ctx          context.Context
	cancel       context.CancelCauseFunc
	stopDeadline context.CancelFunc

	// claim holds the execution's record; lease keeps it while it runs;
	// trail files its audit events.
	claim *claim
	lease *leaseKeeper
	trail *trail

	start     time.Time
	inputHash string
	done      chan struct{}

	// found is the record a create of this delivery found in its place:
	// another claim's, or a cancel's. The takeover table decides from it.
	found    *Record
	foundRev uint64
}

// bare is an execution of req, delivered by msg (nil: none) under
// principal, that may only end without running: its record, trail and
// envelope, no lease.
func (w *Runner) bare(msg jetstream.Msg, req *envelope.Request, principal string) *Execution {
	x := &Execution{w: w, msg: msg, req: req, principal: principal, key: broker.Key(principal, req.ExecutionID),
		start: w.now(), done: make(chan struct{}), stopDeadline: func() {}, trail: &trail{audit: w.audit, worker: w.cfg.ID}}
	x.claim = &claim{s: w.store, key: x.key, token: uuid.NewString(),
		lapsed: func() bool { return x.ctx != nil && errors.Is(context.Cause(x.ctx), errLeaseLost) }}
	return x
}

func (w *Runner) newExecution(msg jetstream.Msg, req *envelope.Request, c Capability) *Execution {
	principal, subjectCapability := broker.Anonymous, ""
	if msg != nil {
		if p, capID, ok := w.b.Names.ParseExecSubject(msg.Subject()); ok {
			principal = p
			if capID != broker.Unrouted {
				subjectCapability = capID
			}
		}
	}
	x := w.bare(msg, req, principal)
	x.cap, x.subjectCapability = c, subjectCapability
	ctx, obs := w.cfg.Observer.Begin(w.base, w.delivery(msg, req, c != nil))
	x.obs = obs
	x.ctx, x.cancel = context.WithCancelCause(ctx)
	if req.Deadline != nil {
		x.ctx, x.stopDeadline = context.WithDeadlineCause(x.ctx, *req.Deadline, errDeadline)
	}
	progress := func() {}
	if msg != nil {
		progress = func() { _ = msg.InProgress() }
	}
	x.lease = &leaseKeeper{claim: x.claim, length: w.cfg.Lease, disabled: w.cfg.DisableLeaseRenewal, now: w.now,
		progress: progress, end: x.cancel, done: x.done, log: w.log, id: req.ExecutionID, stop: make(chan struct{})}
	return x
}

func (x *Execution) event(typ string, data map[string]any) *audit.Event {
	return &audit.Event{
		Type: typ, Surface: x.req.Surface, Actor: audit.ActorOf(x.req.Actor), Principal: x.principal, ExecutionID: x.req.ExecutionID,
		CapabilityID: x.req.CapabilityID, CorrelationID: x.req.CorrelationID, InputHash: x.inputHash, Data: data,
		TraceID: audit.TraceID(x.req.Traceparent),
	}
}

// delivery is what the observer is told of msg's delivery of req.
func (w *Runner) delivery(msg jetstream.Msg, req *envelope.Request, known bool) observe.Delivery {
	d := observe.Delivery{Request: req, Pool: w.cfg.Pool, Worker: w.cfg.ID, Known: known}
	if msg != nil {
		if meta, err := msg.Metadata(); err == nil {
			d.Deliveries, d.Stored = int(meta.NumDelivered), meta.Timestamp
		}
	}
	return d
}

// deliveries is JetStream's count of msg's deliveries (0: unknown).
func deliveries(msg jetstream.Msg) int {
	if msg == nil {
		return 0
	}
	if meta, err := msg.Metadata(); err == nil {
		return int(meta.NumDelivered)
	}
	return 0
}

// stage tells the observer that a stage doing I/O starts (observe.Stage*);
// the returned func ends it.
func (x *Execution) stage(name string) func(error) {
	_, end := x.obs.Stage(x.ctx, name)
	return end
}

// emit files an audit event of the execution.
func (x *Execution) emit(typ string, data map[string]any) { x.trail.publish(x.event(typ, data)) }

// hashInput sets the input hash events carry in place of the input (SI-10).
func (x *Execution) hashInput() {
	if h, err := envelope.InputHash(x.req.Input); err == nil {
		x.inputHash = h
	}
}

// envelope reads the execution's envelope: nil, nil when there is none.
func (x *Execution) envelope() (*envelope.Envelope, error) { return x.w.store.envelope(x.key) }
