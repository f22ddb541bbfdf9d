package engine

import (
	"math/rand/v2"
	"time"

	"github.com/capstan-dev/capstan/envelope"
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
// before anything of it is claimed or written (enter).

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
	d := min(doubled(500*time.Millisecond, deliveries, 4), 5*time.Second)
	return d + time.Duration(float64(d)*jitter/4)
}

// paused is the pause that stops principal's req now, if any.
func (w *worker) paused(principal string, req *envelope.Request) *Pause {
	if w.cfg.Paused == nil {
		return nil
	}
	return w.cfg.Paused(principal, req)
}

// holdFor is how long a held delivery d waits: holdDelay, never past the
// request's start deadline (it then ends NOT_STARTED, as any request no
// worker started).
func (w *worker) holdFor(d Delivery) time.Duration {
	delay := holdDelay(d.Deliveries, rand.Float64())
	if sd := d.facts(w.windows(), w.now()).StartDeadline; !sd.IsZero() {
		delay = min(delay, max(sd.Sub(w.now())+10*time.Millisecond, 0))
	}
	return delay
}

// heldAgain puts back, unread, a delivery of an execution a pause that
// holds stops, and reports whether it does: only when the execution was
// held before (its record, given back, names no worker), nothing on its
// record asks for a decision (a cancel, an end) and its start deadline has
// not passed. Anything else goes through the pipeline to the gate before
// its attempt, which decides; so does a held record older than a third of
// the record window, whose rewrite there keeps it from expiring under a
// long pause.
func (d *delivery) heldAgain() (Action, bool) {
	w, x := d.w, &d.x
	if w.cfg.Paused == nil || w.cfg.Capabilities[x.req.CapabilityID] == nil {
		return Action{}, false
	}
	p := w.cfg.Paused(x.principal, x.req)
	if p == nil || p.Refusal != nil {
		return Action{}, false
	}
	if sd := x.meta.facts(w.windows(), w.now()).StartDeadline; !sd.IsZero() && !w.now().Before(sd) {
		return Action{}, false // past its start deadline: the takeover table ends it NOT_STARTED
	}
	rec, _, err := w.store.load(x.key)
	if err != nil || rec.Worker != "" || rec.CancelRequested || rec.State == StateFinalized || rec.State == StatePending ||
		w.now().Sub(rec.UpdatedAt) > w.windows().Record/3 {
		return Action{}, false
	}
	w.stats.held.Add(1)
	w.cfg.Observer.Paused(x.req.CapabilityID, "held")
	return Action{Do: Wait, Delay: w.holdFor(x.meta)}, true
}

// CancelRunning cancels, as a caller's cancel does (the cancel recorded on
// the execution's record, then its run stopped), every execution of this
// worker whose attempt is running, or starting past its pause gate, and
// that match says is paused; the envelope of each gives reason, the
// operator's. It returns how many it cancelled.
func (r *Runner) CancelRunning(match func(principal string, req *envelope.Request) bool, reason string) int {
	running := r.w.inflight.each(func(f *flight) bool { return f.starting.Load() || f.calling.Load() })
	n := 0
	for _, f := range running {
		if !match(f.principal, f.req) {
			continue
		}
		if _, err := r.RecordCancel(f.principal, f.req.ExecutionID, true); err != nil {
			r.w.log.Warn("a paused execution's cancel was not recorded; its attempt goes on", "executionId", f.req.ExecutionID, "err", err)
			continue
		}
		f.cancel(&operatorCancel{reason: reason})
		n++
	}
	return n
}

// Starting counts the executions of this worker that match says are paused
// and whose attempt has passed its pause gate but not begun its handler: an
// attempt the pauses in place now would not have let through, which starts
// all the same. An operator's confirmation waits until none is left.
func (r *Runner) Starting(match func(principal string, req *envelope.Request) bool) int {
	return len(r.w.inflight.each(func(f *flight) bool { return f.starting.Load() && match(f.principal, f.req) }))
}
