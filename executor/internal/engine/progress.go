package engine

import (
	"sync"
	"time"

	"github.com/capstan-dev/capstan/broker"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/nats-io/nats.go"
)

// What a handler reports of its progress (DESIGN §5, "Progress") is
// ephemeral: coalesced here to at most one message every ProgressEvery,
// published fire-and-forget on core NATS to the execution owner's progress
// subject (no bucket is written for it), and kept as the last value, which
// the lease keeper folds into the record write it makes at each renewal. A
// handler that never reports costs nothing: no timer, no message, no field
// in the record. Reporting never blocks the handler, never fails it, and
// never delays the attempt: the handler only stores the value under a lock;
// a timer's goroutine publishes it.

// ProgressEvery is the shortest time between two progress messages of one
// execution: at most four a second reach anyone, whatever the handler
// reports.
const ProgressEvery = 250 * time.Millisecond

// coalescer is the pure rule of when a report is sent, on the time it is
// given: a report made when none was sent for every goes at once; one made
// sooner waits until every has passed since the last send, and the reports
// made meanwhile are folded into that one send, which carries the latest
// value. So at most one send happens in any period of every, and the last
// report is always sent (unless the attempt ends first).
type coalescer struct {
	every time.Duration
	sent  time.Time // of the last send; zero: none yet
	due   bool      // a send is scheduled
}

// offer is a report made at now. schedule says whether a send must be
// scheduled, after delay; when one is due already, the report rides it.
func (c *coalescer) offer(now time.Time) (delay time.Duration, schedule bool) {
	if c.due {
		return 0, false
	}
	c.due = true
	if c.sent.IsZero() {
		return 0, true
	}
	if wait := c.sent.Add(c.every).Sub(now); wait > 0 {
		return wait, true
	}
	return 0, true
}

// fired is the scheduled send, made at now.
func (c *coalescer) fired(now time.Time) {
	c.sent, c.due = now, false
}

// Reporter takes an attempt's progress reports. One belongs to each
// execution; it is open while an attempt runs and drops what comes before
// or after (a handler still running after its lease was lost, or its
// timeout, reports into nothing).
type Reporter struct {
	// nc publishes the reports (nil: nowhere, a runner of no connection);
	// the subject is names' progress subject of the execution's principal
	// and id, made at the first send (a handler that never reports makes
	// nothing).
	nc        *nats.Conn
	names     broker.Names
	principal string
	id        string
	now       func() time.Time

	mu      sync.Mutex
	attempt int // the attempt reports are taken for; 0: closed
	co      coalescer
	timer   *time.Timer
	pending *envelope.Progress // the value the scheduled send carries
	last    *envelope.Progress // the last value reported, for the record
}

// Report stores what the handler reports of its work: done of total (0: not
// known) and a short message (envelope.CleanProgress). It returns at once:
// the value is published later, coalesced, by a timer.
func (r *Reporter) Report(done, total float64, message string) {
	if r == nil {
		return
	}
	done, total, message = envelope.CleanProgress(done, total, message)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.attempt == 0 {
		return
	}
	now := r.now()
	p := &envelope.Progress{V: envelope.Version, ExecutionID: r.id, Attempt: r.attempt, Done: done, Total: total,
		Message: message, At: now.UTC()}
	r.pending, r.last = p, p
	delay, schedule := r.co.offer(now)
	if !schedule {
		return
	}
	if r.timer == nil {
		r.timer = time.AfterFunc(delay, r.send)
		return
	}
	r.timer.Reset(delay)
}

// send publishes the value due, if the attempt still runs. A publish is
// fire-and-forget: a slow or absent subscriber costs nothing here, and a
// refused one is not tried again (the next report, or the record, will say
// more).
func (r *Reporter) send() {
	r.mu.Lock()
	p := r.pending
	r.pending = nil
	if r.attempt == 0 || p == nil {
		r.mu.Unlock()
		return
	}
	r.co.fired(r.now())
	r.mu.Unlock()
	if r.nc == nil {
		return
	}
	b, err := envelope.Marshal(p)
	if err != nil {
		return
	}
	_ = r.nc.Publish(r.names.ProgressSubject(r.principal, r.id), b)
}

// open takes reports for attempt n, forgetting the last attempt's.
func (r *Reporter) open(n int) {
	r.mu.Lock()
	r.attempt, r.last, r.pending = n, nil, nil
	r.co = coalescer{every: ProgressEvery, sent: r.co.sent}
	r.mu.Unlock()
}

// close stops taking reports: the attempt ended. A value not sent yet is
// dropped (the envelope follows); a send already under way may still go.
func (r *Reporter) close() {
	r.mu.Lock()
	r.attempt, r.pending = 0, nil
	if r.timer != nil {
		r.timer.Stop()
	}
	r.co.due = false
	r.mu.Unlock()
}

// lastReport is the last value reported by the attempt running, nil when it
// reported none: the lease keeper folds it into its renewal.
func (r *Reporter) lastReport() *envelope.Progress {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last
}
