package engine

import (
	"sync"
	"sync/atomic"
	"time"

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

// Reporter takes an execution's progress reports: three words in the
// execution, and nothing more until its handler first reports (a handler
// that never reports costs no allocation). It takes reports only from the
// attempt running: before and after, and from an attempt that ended (a
// handler still running after its timeout or its lost lease, whatever
// attempt runs now), they are dropped.
type Reporter struct {
	x    *execution // whose reports: its runner's connection and names, its principal and id
	open atomic.Int64
	s    atomic.Pointer[reporting] // made at the first report
}

// reporting is what a Reporter holds once its handler reported.
type reporting struct {
	// nc publishes the reports (nil: nowhere, a runner of no connection)
	// on subject, the progress subject of the execution's principal and id.
	nc      *nats.Conn
	subject string
	id      string
	now     func() time.Time

	mu      sync.Mutex
	attempt int64 // the attempt reports are taken for, as of the last sync; 0: none
	co      coalescer
	timer   *time.Timer
	pending *envelope.Progress // the value the scheduled send carries
	last    *envelope.Progress // the last value reported, for the record
}

// Report stores what attempt's handler reports of its work: done of total
// (0: not known) and a short message (envelope.CleanProgress). It returns at
// once: the value is published later, coalesced, by a timer.
func (r *Reporter) Report(attempt int, done, total float64, message string) {
	if r == nil || attempt <= 0 || r.open.Load() != int64(attempt) {
		return
	}
	s := r.s.Load()
	if s == nil {
		s = r.newReporting()
		if !r.s.CompareAndSwap(nil, s) {
			s = r.s.Load()
		}
	}
	s.report(&r.open, int64(attempt), done, total, message)
}

// newReporting is the state of the execution's first report.
func (r *Reporter) newReporting() *reporting {
	s := &reporting{now: time.Now, co: coalescer{every: ProgressEvery}}
	if x := r.x; x != nil {
		s.id = x.req.ExecutionID
		if x.w != nil {
			s.nc, s.now = x.w.nc, x.w.now
			if x.w.b != nil {
				s.subject = x.w.b.Names.ProgressSubject(x.principal, s.id)
			}
		}
	}
	return s
}

// sync makes the state follow the attempt open now (read under the lock,
// so that the last sync sees the last begin or end): a new attempt
// forgets the last one's reports; an end drops what is pending.
func (s *reporting) sync(open *atomic.Int64) {
	n := open.Load()
	if n == s.attempt {
		return
	}
	s.attempt, s.pending = n, nil
	if n != 0 {
		s.last = nil // the ended attempt's stays until another starts
	}
	s.co.due = false
	if s.timer != nil {
		s.timer.Stop()
	}
}

func (s *reporting) report(open *atomic.Int64, attempt int64, done, total float64, message string) {
	done, total, message = envelope.CleanProgress(done, total, message)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sync(open)
	if s.attempt != attempt {
		return
	}
	now := s.now()
	p := &envelope.Progress{V: envelope.Version, ExecutionID: s.id, Attempt: int(attempt), Done: done, Total: total,
		Message: message, At: now.UTC()}
	s.pending, s.last = p, p
	delay, schedule := s.co.offer(now)
	if !schedule {
		return
	}
	if s.timer == nil {
		s.timer = time.AfterFunc(delay, s.send)
		return
	}
	s.timer.Reset(delay)
}

// send publishes the value due, if its attempt still runs. A publish is
// fire-and-forget: a slow or absent subscriber costs nothing here, and a
// refused one is not tried again (the next report, or the record, will say
// more).
func (s *reporting) send() {
	s.mu.Lock()
	p := s.pending
	s.pending = nil
	if s.attempt == 0 || p == nil {
		s.mu.Unlock()
		return
	}
	s.co.fired(s.now())
	s.mu.Unlock()
	if s.nc == nil || s.subject == "" {
		return
	}
	b, err := envelope.Marshal(p)
	if err != nil {
		return
	}
	_ = s.nc.Publish(s.subject, b)
}

// begin takes reports for attempt n, forgetting the last attempt's.
func (r *Reporter) begin(n int) {
	r.open.Store(int64(n))
	r.sync()
}

// end stops taking reports: the attempt ended. A value not sent yet is
// dropped (the envelope follows); a send already under way may still go.
func (r *Reporter) end() {
	r.open.Store(0)
	r.sync()
}

func (r *Reporter) sync() {
	if s := r.s.Load(); s != nil {
		s.mu.Lock()
		s.sync(&r.open)
		s.mu.Unlock()
	}
}

// lastReport is the last value reported by the attempt running, nil when it
// reported none: the lease keeper folds it into its renewal.
func (r *Reporter) lastReport() *envelope.Progress {
	s := r.s.Load()
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sync(&r.open)
	return s.last
}
