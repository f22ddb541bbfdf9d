package delivery

import (
	"context"
	"errors"
	"fmt"
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
	// admitted runs the attempts, once stages 4 to 9 let the execution through.
	admitted Admitted

	// ctx spans the whole execution: the caller's cancel and deadline, a lost
	// claim, the worker's shutdown. Each attempt adds its own timeout.
	ctx          context.Context
	cancel       context.CancelCauseFunc
	stopDeadline context.CancelFunc

	mu  sync.Mutex // guards rec and rev: the lease keeper and the pipeline both CAS
	rec *Record
	rev uint64
	// claim is this delivery's claim token: the record is this execution's
	// while it carries it.
	claim string
	// leaseEnd fires when the lease last written runs out unrenewed (the
	// store stopped answering): the execution's context ends, so that the
	// handler stops before another worker may take over.
	leaseEnd *time.Timer

	start     time.Time
	inputHash string
	done      chan struct{}

	// found is the record a create of this delivery found in its place:
	// another claim's, or a cancel's. The takeover table decides from it.
	found    *Record
	foundRev uint64

	// evMu guards held and holding. While holding, the execution's audit
	// events are kept and published together, as one message: before the
	// claim (they are dropped if the claim finds another record), and for a
	// short while after the attempt starts, so that an execution that ends
	// quickly is one message on the trail (DESIGN §14).
	evMu       sync.Mutex
	held       []*audit.Event
	holding    bool
	flushTimer *time.Timer

	// renewing runs keepLease; stopRenewing ends it before a release, whose
	// lease must not be renewed behind it.
	renewing     sync.WaitGroup
	renewStart   *time.Timer // starts keepLease; guarded by mu
	stopRenewing chan struct{}
	stopOnce     sync.Once
	renewOnce    sync.Once
}

func (w *Runner) newExecution(msg jetstream.Msg, req *envelope.Request, c Capability) *Execution {
	x := &Execution{w: w, msg: msg, req: req, cap: c, start: time.Now(), principal: broker.Anonymous,
		claim: uuid.NewString(), done: make(chan struct{}), stopRenewing: make(chan struct{}), stopDeadline: func() {}}
	if msg != nil {
		if p, capID, ok := w.b.Names.ParseExecSubject(msg.Subject()); ok {
			x.principal = p
			if capID != broker.Unrouted {
				x.subjectCapability = capID
			}
		}
	}
	x.key = broker.Key(x.principal, req.ExecutionID)
	ctx, obs := w.cfg.Observer.Begin(w.base, w.delivery(msg, req, c != nil))
	x.obs = obs
	x.ctx, x.cancel = context.WithCancelCause(ctx)
	if req.Deadline != nil {
		x.ctx, x.stopDeadline = context.WithDeadlineCause(x.ctx, *req.Deadline, errDeadline)
	}
	return x
}

// Detached returns an execution of req that no delivery carries, its
// context the runner's: for benchmarks of the stages, which run without a
// broker.
func (w *Runner) Detached(req *envelope.Request, c Capability) *Execution {
	return w.newExecution(nil, req, c)
}

// StoreContext bounds one store operation; it is not tied to the execution,
// whose cancellation must not stop it from recording its own end.
func StoreContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 10*time.Second)
}

// casCtx bounds one operation on the record: short against the lease, so
// that a request lost with a server is sent again (to its restart, or to
// another node) while the lease still holds.
func (x *Execution) casCtx() (context.Context, context.CancelFunc) {
	d := min(max(x.w.cfg.Lease/4, 250*time.Millisecond), 10*time.Second)
	return context.WithTimeout(context.Background(), d)
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

// Stage tells the observer that a stage doing I/O starts (observe.Stage*);
// the returned func ends it.
func (x *Execution) Stage(name string) func(error) {
	_, end := x.obs.Stage(x.ctx, name)
	return end
}

// Request is the request being executed.
func (x *Execution) Request() *envelope.Request { return x.req }

// Principal is who sent the request: the token of the subject the NATS
// server let it publish on, never a field of the body.
func (x *Execution) Principal() string { return x.principal }

// SubjectCapability is the capability id of the subject the request arrived
// on ("" when it came through _unrouted): a body naming another is refused.
func (x *Execution) SubjectCapability() string { return x.subjectCapability }

// Context spans the whole execution: the caller's cancel and deadline, a lost
// claim, the worker's shutdown.
func (x *Execution) Context() context.Context { return x.ctx }

// Emit files an audit event of the execution.
func (x *Execution) Emit(typ string, data map[string]any) { x.emit(typ, data) }

func (x *Execution) emit(typ string, data map[string]any) { x.publish(x.event(typ, data)) }

// publish files ev: kept while the execution holds its events, published
// at once otherwise. Events are handed to the emitter under evMu, so that
// they reach the stream in the order they were filed, whoever flushes.
func (x *Execution) publish(ev *audit.Event) {
	ev.Worker = x.w.cfg.ID
	x.evMu.Lock()
	defer x.evMu.Unlock()
	if x.holding {
		x.held = append(x.held, ev)
		return
	}
	x.w.audit.Emit(ev)
}

// hold starts keeping the execution's events (see Execution.held).
func (x *Execution) hold() {
	x.evMu.Lock()
	x.holding = true
	x.evMu.Unlock()
}

// flushHeld ends holding: what was kept is published as one message, then
// every later event at once.
func (x *Execution) flushHeld() {
	x.evMu.Lock()
	defer x.evMu.Unlock()
	evs := x.held
	x.held, x.holding = nil, false
	if x.flushTimer != nil {
		x.flushTimer.Stop()
	}
	if len(evs) > 0 {
		x.w.audit.EmitAll(evs...)
	}
}

// flushHeldSync is flushHeld with ev added, acknowledged by JetStream before
// it returns (strict audit).
func (x *Execution) flushHeldSync(ev *audit.Event) error {
	ev.Worker = x.w.cfg.ID
	x.evMu.Lock()
	defer x.evMu.Unlock()
	evs := append(x.held, ev)
	x.held, x.holding = nil, false
	if x.flushTimer != nil {
		x.flushTimer.Stop()
	}
	return x.w.audit.EmitAllSync(x.ctx, evs...)
}

// dropHeld forgets the events kept before a claim that found another
// record: that record's execution has its own trail.
func (x *Execution) dropHeld() {
	x.evMu.Lock()
	x.held, x.holding = nil, false
	x.evMu.Unlock()
}

// flushSoon publishes what is held after holdEvents, unless the execution
// ends first and publishes it with its terminal event.
func (x *Execution) flushSoon() {
	x.evMu.Lock()
	defer x.evMu.Unlock()
	if x.holding && x.flushTimer == nil {
		x.flushTimer = time.AfterFunc(holdEvents, x.flushHeld)
	}
}

// holdEvents is how long an attempt's first events wait for its end, to be
// published with it as one message.
const holdEvents = 20 * time.Millisecond

// Record returns a copy of the record as this worker last saw it; the lease
// keeper may change it at any time.
func (x *Execution) Record() Record { return x.record() }

func (x *Execution) record() Record {
	x.mu.Lock()
	defer x.mu.Unlock()
	return *x.rec
}

// hashInput sets the input hash events carry in place of the input (SI-10).
func (x *Execution) hashInput() {
	if h, err := envelope.InputHash(x.req.Input); err == nil {
		x.inputHash = h
	}
}

// errLost reports that the record no longer belongs to this worker.
var errLost = errors.New("capstan: execution record no longer ours")

// errCancelRequested reports that the record says the caller cancelled.
var errCancelRequested = errors.New("capstan: cancel requested")

// errUnsettled reports that the store did not answer: the record may or may
// not have changed, and may or may not still be ours.
var errUnsettled = errors.New("capstan: execution record unreachable")

// Update changes the execution's record (see update).
func (x *Execution) Update(change func(r *Record)) error { return x.update(change) }

// update applies change to the record with a CAS on its revision. On a lost
// CAS (or any error, which may hide a write that happened) it re-reads: if the
// record still carries this claim it applies change again; if another claim
// owns it (another worker, or a process sharing this worker's id), or
// it is finalized, it returns errLost; a cancel request set meanwhile is
// applied and reported as errCancelRequested. When the store does not answer
// for a while it returns errUnsettled.
//
// A store that does not answer (a replicated bucket electing a new leader) is
// waited for up to storeOutage: giving up early would leave a record that
// says the execution is ours, or running, when it is neither.
func (x *Execution) update(change func(r *Record)) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.rec == nil {
		return errUnsettled // nothing claimed
	}
	var last error
	start := time.Now()
	for try := 0; !x.w.storeGivesUp(start, try); try++ {
		next := *x.rec
		change(&next)
		next.UpdatedAt = time.Now().UTC()
		ctx, cancel := x.casCtx()
		rev, err := broker.UpdateTTL(ctx, x.w.b.JS, x.w.b.Executions, x.key, &next, x.rev, x.w.recordTTL(&next))
		cancel()
		if err == nil {
			x.rec, x.rev = &next, rev
			if x.leaseEnd != nil {
				x.leaseEnd.Reset(time.Until(next.LeaseUntil))
			}
			if next.CancelRequested {
				return errCancelRequested
			}
			return nil
		}
		last = err
		if errors.Is(context.Cause(x.ctx), errLeaseLost) {
			// The lease ran out unrenewed: another worker may own it now.
			return errLost
		}
		ctx, cancel = x.casCtx()
		cur, curRev, lerr := broker.Load[Record](ctx, x.w.b.Executions, x.key)
		cancel()
		if errors.Is(lerr, broker.ErrNotFound) {
			// The record outlived its window unwritten: nothing says the
			// execution is still ours.
			return errLost
		}
		if lerr != nil {
			last = lerr
			time.Sleep(broker.Backoff(try))
			continue
		}
		if cur.Claim != x.claim || cur.State == StateFinalized {
			x.rec, x.rev = cur, curRev
			return errLost
		}
		if curRev == x.rev {
			time.Sleep(broker.Backoff(try)) // spurious failure: the record did not move
		}
		x.rec, x.rev = cur, curRev
	}
	return fmt.Errorf("%w: %v", errUnsettled, last)
}

// storeOutage is how long a worker keeps trying a write that the store does
// not answer: longer than a replicated bucket takes to elect a new leader.
const storeOutage = time.Minute

// storeGivesUp reports whether a write tried since start should stop: after
// storeOutage, or after a few tries once the worker is shutting down.
func (w *Runner) storeGivesUp(start time.Time, try int) bool {
	if w.base.Err() != nil {
		return try >= 20
	}
	return try >= 20 && time.Since(start) > storeOutage
}

// startRenewing starts keepLease, and arms the lease's end: a lease that
// runs out unrenewed (a worker cut off from the store) ends the execution's
// context with errLeaseLost, which the handler sees as ctx.Done().
func (x *Execution) startRenewing() {
	x.renewOnce.Do(x.startRenewingOnce)
}

func (x *Execution) startRenewingOnce() {
	if !x.w.cfg.DisableLeaseRenewal {
		x.mu.Lock()
		if x.leaseEnd == nil {
			x.leaseEnd = time.AfterFunc(time.Until(x.rec.LeaseUntil), func() {
				x.w.log.Warn("lease ran out unrenewed: the handler's context ends", "executionId", x.req.ExecutionID)
				x.cancel(errLeaseLost)
			})
		}
		x.mu.Unlock()
	}
	if x.w.cfg.DisableLeaseRenewal {
		return
	}
	// The keeper starts at its first renewal: most executions end before it.
	x.renewing.Add(1)
	t := time.AfterFunc(x.w.cfg.Lease/3, func() {
		defer x.renewing.Done()
		x.keepLease()
	})
	x.mu.Lock()
	x.renewStart = t
	x.mu.Unlock()
}

// stopRenewStart stops a lease keeper that has not started yet.
func (x *Execution) stopRenewStart() {
	x.mu.Lock()
	t := x.renewStart
	x.mu.Unlock()
	if t != nil && t.Stop() {
		x.renewing.Done() // it never will
	}
}

// stopLease ends the lease renewal and waits until no renewal is in flight.
func (x *Execution) stopLease() {
	x.stopOnce.Do(func() { close(x.stopRenewing) })
	x.stopLeaseEnd()
	x.stopRenewStart()
	x.renewing.Wait()
}

func (x *Execution) stopLeaseEnd() {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.leaseEnd != nil {
		x.leaseEnd.Stop()
	}
}

// keepLease renews the lease and the delivery at once, then every third of
// the lease until the execution ends; it cancels the execution when the claim
// is lost or a cancel is recorded.
func (x *Execution) keepLease() {
	for t := (*time.Ticker)(nil); ; {
		select {
		case <-x.done:
			return
		case <-x.stopRenewing:
			return
		default:
		}
		if !x.renew() {
			return
		}
		if t == nil {
			t = time.NewTicker(x.w.cfg.Lease / 3)
			defer t.Stop()
		}
		select {
		case <-x.done:
			return
		case <-x.stopRenewing:
			return
		case <-t.C:
		}
	}
}

// renew renews the lease and the delivery once, and reports whether the
// execution is still this worker's to renew.
func (x *Execution) renew() bool {
	_ = x.msg.InProgress()
	err := x.update(func(r *Record) { r.LeaseUntil = time.Now().UTC().Add(x.w.cfg.Lease) })
	switch {
	case errors.Is(err, errCancelRequested):
		x.cancel(errCallerCancelled)
	case errors.Is(err, errLost):
		x.cancel(errLeaseLost)
		return false
	}
	// errUnsettled: the lease may still be ours; try again next time.
	return true
}
