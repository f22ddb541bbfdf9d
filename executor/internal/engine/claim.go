package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/observe"
	"github.com/nats-io/nats.go/jetstream"
)

// claim is one execution's hold on its record (DESIGN §5): the random token
// it writes there, and the record and revision it last wrote or read. The
// record is the execution's while it carries the token; every change is a
// compare-and-swap on the revision, and a swap that fails is decided by what
// a read finds. The attempt loop and the lease keeper share it.
type claim struct {
	s     *store
	key   string
	token string
	// lapsed is set when the lease this claim last wrote ran out unrenewed,
	// or a renewal found another claim: another worker may own the record
	// by now.
	lapsed atomic.Bool
	// watcher is told the lease of every record written, nil until the
	// lease keeper arms the lease's end.
	watcher leaseWatcher

	mu  sync.Mutex // the lease keeper and the attempt loop both swap
	rec *Record
	rev uint64
}

// errLost reports that the record no longer belongs to this worker.
var errLost = errors.New("capstan: execution record no longer ours")

// errCancelRequested reports that the record says the caller cancelled.
var errCancelRequested = errors.New("capstan: cancel requested")

// errUnsettled reports that the store did not answer: the record may or may
// not have changed, and may or may not still be ours.
var errUnsettled = errors.New("capstan: execution record unreachable")

// create writes the execution's first record, create-only, with the record
// window as its TTL, as this claim's. When another record is there it
// returns it (found, with its revision); when the store did not answer,
// neither ok nor a record. obs is told of each write (the observer's claim
// stage).
func (c *claim) create(rec *Record, obs stager) (found *Record, foundRev uint64, ok bool) {
	for try := 0; try < 10; try++ {
		end := obs.stage(observe.StageClaim)
		rev, err := c.s.create(c.key, rec)
		end(unlessExists(err))
		if err == nil {
			c.hold(rec, rev)
			return nil, 0, true
		}
		if !errors.Is(err, broker.ErrExists) {
			// The create may have happened: the read below decides either way.
			time.Sleep(broker.Backoff(try))
		}
		cur, curRev, err := c.s.load(c.key)
		if errors.Is(err, broker.ErrNotFound) {
			continue
		}
		if err != nil {
			c.s.log.Warn("read execution record", "executionId", rec.ExecutionID, "err", err)
			return nil, 0, false
		}
		if cur.Claim == c.token {
			// Our own create, whose answer was lost.
			c.hold(cur, curRev)
			return nil, 0, true
		}
		return cur, curRev, false
	}
	return nil, 0, false
}

// hold makes rec, at revision rev, the record this claim last wrote or read.
func (c *claim) hold(rec *Record, rev uint64) {
	c.mu.Lock()
	c.rec, c.rev = rec, rev
	c.mu.Unlock()
}

// drop forgets the record: a takeover's swap did not make it this claim's.
func (c *claim) drop() { c.hold(nil, 0) }

// held is the record this claim holds, nil before the claim is made.
func (c *claim) held() *Record {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.rec
}

// leaseWatcher is told the lease of the records a claim writes.
type leaseWatcher interface {
	wrote(leaseUntil time.Time)
}

// watch tells w the lease of the record held now, then that of every record
// this claim writes.
func (c *claim) watch(w leaseWatcher) {
	c.mu.Lock()
	defer c.mu.Unlock()
	w.wrote(c.rec.LeaseUntil)
	c.watcher = w
}

// record is a copy of the record as this claim last saw it; the lease keeper
// may change it at any time.
func (c *claim) record() Record {
	c.mu.Lock()
	defer c.mu.Unlock()
	return *c.rec
}

// update applies change to the record with a compare-and-swap on its
// revision. On a lost swap (or any error, which may hide a write that
// happened) it reads the record again: if it still carries this claim it
// applies change again; if another claim owns it (another worker, or a
// process sharing this worker's id), or it is finalized, it returns errLost;
// a cancel request set meanwhile is applied and reported as
// errCancelRequested. When the store does not answer for a while it returns
// errUnsettled.
//
// A store that does not answer (a replicated bucket electing a new leader)
// is waited for up to storeOutage: giving up early would leave a record that
// says the execution is ours, or running, when it is neither.
func (c *claim) update(change func(r *Record)) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.rec == nil {
		return errUnsettled // nothing claimed
	}
	var last error
	start := c.s.now()
	for try := 0; !c.s.givesUp(start, try); try++ {
		next := *c.rec
		change(&next)
		next.UpdatedAt = c.s.now().UTC()
		rev, err := c.s.swap(c.key, &next, c.rev)
		if err == nil {
			c.rec, c.rev = &next, rev
			if c.watcher != nil {
				c.watcher.wrote(next.LeaseUntil)
			}
			if next.CancelRequested {
				return errCancelRequested
			}
			return nil
		}
		last = err
		if c.lapsed.Load() {
			// The lease ran out unrenewed: another worker may own it now.
			return errLost
		}
		cur, curRev, lerr := c.s.load(c.key)
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
		if cur.Claim != c.token || cur.State == StateFinalized {
			c.rec, c.rev = cur, curRev
			return errLost
		}
		if curRev == c.rev {
			time.Sleep(broker.Backoff(try)) // spurious failure: the record did not move
		}
		c.rec, c.rev = cur, curRev
	}
	return fmt.Errorf("%w: %v", errUnsettled, last)
}

// unlessExists is err, unless it is the ErrExists of a record already there.
func unlessExists(err error) error {
	if errors.Is(err, broker.ErrExists) {
		return nil
	}
	return err
}

// leaseKeeper keeps an execution's lease (DESIGN §5) while its worker runs
// it: it renews the lease on the record, and the delivery's ack timer, every
// third of the lease; and it arms the lease's end, so that a lease that runs
// out unrenewed (a worker cut off from the store) ends the execution's
// context, and the handler sees ctx.Done() before another worker may take
// over. A renewal that finds another claim ends the execution the same way;
// one that finds a cancel recorded ends it as the caller's cancel.
type leaseKeeper struct {
	claim    *claim
	length   time.Duration
	disabled bool // no renewal, no end (tests of redelivery)
	// unclaimed: a read without a claim (DESIGN §14): only the delivery's
	// ack timer is renewed, and nothing ends the execution for a lease.
	unclaimed bool
	now       func() time.Time
	// msg is the delivery, whose ack timer each renewal restarts
	// (InProgress).
	msg jetstream.Msg
	// end ends the execution's context, with its cause; lost ends its
	// held context (and so the execution's) as the claim is lost.
	end, lost context.CancelCauseFunc
	// done is closed when the execution ends.
	done <-chan struct{}
	log  *slog.Logger
	id   string // the execution's, for the log
	// progress takes what the attempt running reports of its progress;
	// each renewal writes the last report into the record (DESIGN §5,
	// "Progress"): no write of its own.
	progress Reporter

	mu sync.Mutex
	// until is the lease last written; expiry fires when it runs out,
	// armed once it could run out before the renewals start (most
	// executions end before either).
	until   time.Time
	expiry  *time.Timer
	starter *time.Timer // starts the renewals, at startAt
	startAt time.Time

	renewing  sync.WaitGroup
	stop      chan struct{}
	stopOnce  sync.Once
	startOnce sync.Once
}

// Causes that end an execution's context.
var (
	errCallerCancelled = errors.New("cancelled by the caller")
	errDeadline        = errors.New("the request's deadline passed")
	errLeaseLost       = errors.New("the claim was lost to another worker")
	errShutdown        = errors.New("the worker shut down before the execution ended")
	errAttemptTimeout  = errors.New("the attempt timed out")
)

// operatorCancel is the cause of an attempt an operator's pause cancelled
// (capstan pause --cancel-running): a caller's cancel, with the operator's
// reason, which the envelope says.
type operatorCancel struct{ reason string }

func (c *operatorCancel) Error() string { return "cancelled by an operator's pause: " + c.reason }
func (c *operatorCancel) Unwrap() error { return errCallerCancelled }

// start arms the lease's end and the renewals, once. The renewals start at
// the first one: most executions end before it.
func (l *leaseKeeper) start() {
	l.startOnce.Do(func() {
		if l.disabled {
			return
		}
		l.mu.Lock()
		l.startAt = l.now().Add(l.length / 3)
		l.renewing.Add(1)
		l.starter = time.AfterFunc(l.length/3, l.renewals)
		l.mu.Unlock()
		if !l.unclaimed {
			l.claim.watch(l)
		}
	})
}

// renewals starts the renewals: the lease's end is armed first, if it was
// not, unless the keeper was disarmed meanwhile (the execution ended as
// the renewals' start fired).
func (l *leaseKeeper) renewals() {
	defer l.renewing.Done()
	l.mu.Lock()
	if l.starter != nil && l.expiry == nil && !l.until.IsZero() { // zero: a read without a claim
		l.armExpiry()
	}
	l.mu.Unlock()
	l.keep()
}

// wrote moves the lease's end to until, the lease the claim last wrote. The
// claim calls it under its lock. Its timer is armed only when the lease
// could run out before the renewals start, which arm it otherwise. After
// halt nothing is armed: the lease the claim writes then is a give-back's,
// ended on purpose (DESIGN §5), not one that ran out.
func (l *leaseKeeper) wrote(until time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.until = until
	switch {
	case l.halted():
	case l.expiry != nil:
		l.expiry.Reset(until.Sub(l.now()))
	case until.Before(l.startAt) || l.starter == nil:
		l.armExpiry()
	}
}

// armExpiry arms the lease's end at until; under l.mu.
func (l *leaseKeeper) armExpiry() {
	l.expiry = time.AfterFunc(l.until.Sub(l.now()), l.ranOut)
}

// ranOut ends the execution whose lease ran out unrenewed.
func (l *leaseKeeper) ranOut() {
	l.log.Warn("lease ran out unrenewed: the handler's context ends", "executionId", l.id)
	l.lose()
}

// halt ends the renewals and waits until none is in flight: a release's
// lease must not be renewed behind it.
func (l *leaseKeeper) halt() {
	l.stopOnce.Do(func() { close(l.stop) })
	l.disarm()
	l.renewing.Wait()
}

// halted reports whether halt was called: the keeper keeps nothing more.
func (l *leaseKeeper) halted() bool {
	select {
	case <-l.stop:
		return true
	default:
		return false
	}
}

// disarm stops the lease's end and renewals not started yet: the execution
// ends.
func (l *leaseKeeper) disarm() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.expiry != nil {
		l.expiry.Stop()
	}
	if l.starter != nil && l.starter.Stop() {
		l.renewing.Done() // it never will
	}
	l.starter = nil
}

// keep renews the lease and the delivery at once, then every third of the
// lease until the execution ends.
func (l *leaseKeeper) keep() {
	for t := (*time.Ticker)(nil); ; {
		select {
		case <-l.done:
			return
		case <-l.stop:
			return
		default:
		}
		if !l.renew() {
			return
		}
		if t == nil {
			t = time.NewTicker(l.length / 3)
			defer t.Stop()
		}
		select {
		case <-l.done:
			return
		case <-l.stop:
			return
		case <-t.C:
		}
	}
}

// renew renews the lease and the delivery once, and reports whether the
// execution is still this worker's to renew.
func (l *leaseKeeper) renew() bool {
	if l.msg != nil {
		_ = l.msg.InProgress()
	}
	if l.unclaimed {
		return true
	}
	p := l.progress.lastReport()
	err := l.claim.update(func(r *Record) {
		r.LeaseUntil = l.now().UTC().Add(l.length)
		if p != nil {
			r.Progress = p
		}
	})
	switch {
	case errors.Is(err, errCancelRequested):
		l.end(errCallerCancelled)
	case errors.Is(err, errLost):
		l.lose()
		return false
	}
	// errUnsettled: the lease may still be ours; try again next time.
	return true
}

// lose ends the execution as one whose claim is lost: its context ends with
// errLeaseLost, and its claim writes nothing more.
func (l *leaseKeeper) lose() {
	l.claim.lapsed.Store(true)
	l.lost(errLeaseLost)
}

// stager is told when a stage doing I/O starts, and returns its end.
type stager interface {
	stage(name string) func(error)
}
