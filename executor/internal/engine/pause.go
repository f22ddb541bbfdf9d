package engine

import (
	"math/rand/v2"
	"time"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/broker"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/nats-io/nats.go/jetstream"
)

// Operators' pauses (DESIGN §18). Before an attempt starts, the engine asks
// whether an operator paused what it would run (Config.Paused, answered from
// the worker's watched copy: no server message). A pause that refuses ends
// the execution PAUSED; one that holds leaves it in its queue: a fresh
// execution's delivery is put back, its claim given up as a limit's wait
// gives it up (so that the record, naming no worker, keeps what the
// delivery established), and a retry or a takeover waits where it is, its
// claim kept, until the pause changes or its context ends. A delivery of an
// execution held before is put back as soon as it is read (heldAgain),
// before anything of it is claimed or written.

// Pause is an operators' pause that stops an execution's attempts.
type Pause struct {
	// Refusal, when set, ends the execution with it; otherwise the pause
	// holds the execution.
	Refusal *envelope.CapabilityError
	// Changed is closed when the pauses change.
	Changed <-chan struct{}
	// Data is what the execution's trail says of the pause.
	Data map[string]any
}

// holdDelay is how long a held delivery waits before it comes back, at its
// deliveries-th delivery: half a second at first, doubling to 5 s, and a
// little more at random so that the held calls do not all come back
// together. Every put-back is a delivery (the pool's consumer delivers
// without limit, MaxDeliver -1), so none is burnt; the longest wait bounds
// how soon the held calls run once the pause is lifted.
func holdDelay(deliveries int, jitter float64) time.Duration {
	d := min(500*time.Millisecond<<min(max(deliveries-1, 0), 4), 5*time.Second)
	return d + time.Duration(float64(d)*jitter/4)
}

// paused is the pause that stops e's attempts now, if any.
func (r *Runner) paused(e *Execution) *Pause {
	if r.cfg.Paused == nil {
		return nil
	}
	return r.cfg.Paused(e.principal, e.req)
}

// pauseGate is the check before attempt n starts; it reports whether the
// attempt may. fresh is an execution that has run no attempt (attempt 1,
// not a takeover). When the attempt may not, the execution has been ended
// or put back as the pause says.
func (e *Execution) pauseGate(n int, fresh bool) bool {
	p := e.pausedNow()
	if p == nil {
		return true
	}
	if p.Refusal == nil && fresh {
		e.r.held.Add(1)
		e.r.cfg.Observer.Paused(e.req.CapabilityID, "held")
		if e.claim.held() != nil {
			// Outside the held trail: the put-back drops what it holds.
			e.r.emit(e.event(audit.EventHeld, p.Data))
		}
		e.releaseThen(true, func() { nak(e.msg, e.r.holdFor(e.delivery)) })
		return false
	}
	// A retry or a takeover: an attempt may have run, so the execution keeps
	// its claim and waits here.
	for p != nil && p.Refusal == nil {
		select {
		case <-p.Changed:
		case <-e.ctx.Done():
			e.endByContext(n - 1)
			return false
		}
		p = e.pausedNow()
	}
	if p == nil {
		return true
	}
	e.r.pauseRefused.Add(1)
	e.r.cfg.Observer.Paused(e.req.CapabilityID, "refused")
	e.finalize(failed(p.Refusal), n-1)
	return false
}

// pausedNow is the pause that stops e's next attempt, nil when none does, in
// which case e is starting until its handler begins. starting is set before
// the pauses are read, and a pause's set is in place before a worker looks
// for what it must cancel or wait for (CancelRunning, Starting): of an
// attempt that read the pauses before a change, the worker that made the
// change sees it starting.
func (e *Execution) pausedNow() *Pause {
	e.starting.Store(true)
	p := e.r.paused(e)
	if p != nil {
		e.starting.Store(false)
	}
	return p
}

// holdFor is how long a held delivery d waits: holdDelay, never past the
// request's start deadline (it then ends NOT_STARTED, as any request no
// worker started).
func (r *Runner) holdFor(d Delivery) time.Duration {
	delay := holdDelay(d.Deliveries, rand.Float64())
	if sd := d.facts(r.windows(), r.now()).StartDeadline; !sd.IsZero() {
		delay = min(delay, max(sd.Sub(r.now())+10*time.Millisecond, 0))
	}
	return delay
}

// heldAgain puts back, unread, a delivery of an execution a pause that
// holds stops, and reports whether it did: only when the execution was held
// before (its record, given back, names no worker), nothing on its record
// asks for a decision (a cancel, an end) and its start deadline has not
// passed. Anything else goes through
// the pipeline to the gate before its attempt, which decides; so does a
// held record older than a third of the record window, whose rewrite there
// keeps it from expiring under a long pause.
func (r *Runner) heldAgain(msg jetstream.Msg, principal string, req *envelope.Request, d Delivery) bool {
	if r.cfg.Paused == nil {
		return false
	}
	p := r.cfg.Paused(principal, req)
	if p == nil || p.Refusal != nil {
		return false
	}
	if sd := d.facts(r.windows(), r.now()).StartDeadline; !sd.IsZero() && !r.now().Before(sd) {
		return false // past its start deadline: the takeover table ends it NOT_STARTED
	}
	rec, _, err := r.store.load(broker.Key(principal, req.ExecutionID))
	if err != nil || rec.Worker != "" || rec.CancelRequested || rec.State == StateFinalized || rec.State == StatePending ||
		r.now().Sub(rec.UpdatedAt) > r.windows().Record/3 {
		return false
	}
	r.held.Add(1)
	r.cfg.Observer.Paused(req.CapabilityID, "held")
	nak(msg, r.holdFor(d))
	return true
}

// CancelRunning cancels, as a caller's cancel does (the cancel recorded on
// the execution's record, then its run stopped), every execution of this
// worker whose attempt is running, or starting past its pause gate, and
// that match says is paused. It returns how many it cancelled.
func (r *Runner) CancelRunning(match func(principal string, req *envelope.Request) bool) int {
	r.mu.Lock()
	running := make([]*Execution, 0, len(r.inflight))
	for _, x := range r.inflight {
		if x.starting.Load() || x.lease.progress.open.Load() > 0 {
			running = append(running, x)
		}
	}
	r.mu.Unlock()
	n := 0
	for _, x := range running {
		if !match(x.principal, x.req) {
			continue
		}
		if _, err := r.RecordCancel(x.principal, x.req.ExecutionID, true); err != nil {
			r.log.Warn("a paused execution's cancel was not recorded; its attempt goes on", "executionId", x.req.ExecutionID, "err", err)
			continue
		}
		x.cancel(errCallerCancelled)
		n++
	}
	return n
}

// Starting counts the executions of this worker that match says are paused
// and whose attempt has passed its pause gate but not begun its handler: an
// attempt the pauses in place now would not have let through, which starts
// all the same. An operator's confirmation waits until none is left.
func (r *Runner) Starting(match func(principal string, req *envelope.Request) bool) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, x := range r.inflight {
		if x.starting.Load() && match(x.principal, x.req) {
			n++
		}
	}
	return n
}
