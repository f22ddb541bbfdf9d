package engine

import (
	"context"
	"errors"
	"sync"
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
	r   *Runner
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
	// no attempt had started (AbsenceProves).
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
func (r *Runner) bare(msg jetstream.Msg, req *envelope.Request, principal string) *Execution {
	x := &Execution{r: r, msg: msg, req: req, principal: principal, key: broker.Key(principal, req.ExecutionID),
		start: r.now(), done: make(chan struct{}), stopDeadline: func() {}, trail: &trail{audit: r.audit, worker: r.cfg.ID}}
	x.claim = &claim{s: r.store, key: x.key, token: uuid.NewString(),
		lapsed: func() bool { return x.ctx != nil && errors.Is(context.Cause(x.ctx), errLeaseLost) }}
	return x
}

func (r *Runner) newExecution(msg jetstream.Msg, req *envelope.Request, c Capability) *Execution {
	principal, subjectCapability := broker.Anonymous, ""
	if msg != nil {
		if p, capID, ok := r.b.Names.ParseExecSubject(msg.Subject()); ok {
			principal = p
			if capID != broker.Unrouted {
				subjectCapability = capID
			}
		}
	}
	x := r.bare(msg, req, principal)
	x.cap, x.subjectCapability = c, subjectCapability
	ctx, obs := r.cfg.Observer.Begin(r.base, r.delivery(msg, req, c != nil))
	x.obs = obs
	x.ctx, x.cancel = context.WithCancelCause(ctx)
	if req.Deadline != nil {
		x.ctx, x.stopDeadline = context.WithDeadlineCause(x.ctx, *req.Deadline, errDeadline)
	}
	progress := func() {}
	if msg != nil {
		progress = func() { _ = msg.InProgress() }
	}
	x.lease = &leaseKeeper{claim: x.claim, length: r.cfg.Lease, disabled: r.cfg.DisableLeaseRenewal, now: r.now,
		progress: progress, end: x.cancel, done: x.done, log: r.log, id: req.ExecutionID, stop: make(chan struct{})}
	return x
}

func (e *Execution) event(typ string, data map[string]any) *audit.Event {
	return &audit.Event{
		Type: typ, Surface: e.req.Surface, Actor: audit.ActorOf(e.req.Actor), Principal: e.principal, ExecutionID: e.req.ExecutionID,
		CapabilityID: e.req.CapabilityID, CorrelationID: e.req.CorrelationID, InputHash: e.inputHash, Data: data,
		TraceID: audit.TraceID(e.req.Traceparent),
	}
}

// delivery is what the observer is told of msg's delivery of req.
func (r *Runner) delivery(msg jetstream.Msg, req *envelope.Request, known bool) observe.Delivery {
	d := observe.Delivery{Request: req, Pool: r.cfg.Pool, Worker: r.cfg.ID, Known: known}
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
func (e *Execution) stage(name string) func(error) {
	_, end := e.obs.Stage(e.ctx, name)
	return end
}

// emit files an audit event of the execution.
func (e *Execution) emit(typ string, data map[string]any) { e.trail.publish(e.event(typ, data)) }

// hashInput sets the input hash events carry in place of the input (SI-10).
func (e *Execution) hashInput() {
	if h, err := envelope.InputHash(e.req.Input); err == nil {
		e.inputHash = h
	}
}

// envelope reads the execution's envelope: nil, nil when there is none.
func (e *Execution) envelope() (*envelope.Envelope, error) { return e.r.store.envelope(e.key) }

// trail files an execution's audit events (DESIGN §8). While it holds them,
// they are kept and published together, as one message: before the claim
// (they are dropped if the claim finds another record, whose execution has
// its own trail), and for a short while after the attempt starts, so that an
// execution that ends quickly is one message on the trail (DESIGN §14).
// Events reach the emitter under the trail's lock, so that they reach the
// stream in the order they were filed, whoever flushes.
type trail struct {
	audit  *audit.Emitter
	worker string

	mu      sync.Mutex
	held    []*audit.Event
	holding bool
	timer   *time.Timer
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
	t.mu.Unlock()
}

// flush ends holding: what was kept is published as one message, then
// every later event at once.
func (t *trail) flush() {
	t.mu.Lock()
	defer t.mu.Unlock()
	evs := t.held
	t.held, t.holding = nil, false
	if t.timer != nil {
		t.timer.Stop()
	}
	if len(evs) > 0 {
		t.audit.EmitAll(evs...)
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
	if t.timer != nil {
		t.timer.Stop()
	}
	return t.audit.EmitAllSync(ctx, evs...)
}

// drop forgets what is held: the claim found another record.
func (t *trail) drop() {
	t.mu.Lock()
	t.held, t.holding = nil, false
	t.mu.Unlock()
}

// flushSoon publishes what is held after holdEvents, unless the execution
// ends first and publishes it with its terminal event.
func (t *trail) flushSoon() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.holding && t.timer == nil {
		t.timer = time.AfterFunc(holdEvents, t.flush)
	}
}
