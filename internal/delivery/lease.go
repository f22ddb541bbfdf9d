package delivery

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"
)

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
	now      func() time.Time
	// progress restarts the delivery's ack timer (InProgress).
	progress func()
	// end ends the execution's context, with its cause.
	end context.CancelCauseFunc
	// done is closed when the execution ends.
	done <-chan struct{}
	log  *slog.Logger
	id   string // the execution's, for the log

	mu      sync.Mutex
	expiry  *time.Timer // fires when the lease last written runs out
	starter *time.Timer // starts the renewals

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

// start arms the lease's end and the renewals, once. The renewals start at
// the first one: most executions end before it.
func (l *leaseKeeper) start() {
	l.startOnce.Do(func() {
		if l.disabled {
			return
		}
		l.claim.watch(l.wrote)
		l.mu.Lock()
		defer l.mu.Unlock()
		l.renewing.Add(1)
		l.starter = time.AfterFunc(l.length/3, func() {
			defer l.renewing.Done()
			l.keep()
		})
	})
}

// wrote moves the lease's end to until, the lease the claim last wrote
// (armed at the first call). The claim calls it under its lock.
func (l *leaseKeeper) wrote(until time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.expiry != nil {
		l.expiry.Reset(until.Sub(l.now()))
		return
	}
	l.expiry = time.AfterFunc(until.Sub(l.now()), func() {
		l.log.Warn("lease ran out unrenewed: the handler's context ends", "executionId", l.id)
		l.end(errLeaseLost)
	})
}

// halt ends the renewals and waits until none is in flight: a release's
// lease must not be renewed behind it.
func (l *leaseKeeper) halt() {
	l.stopOnce.Do(func() { close(l.stop) })
	l.disarm()
	l.renewing.Wait()
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
	l.progress()
	err := l.claim.update(func(r *Record) { r.LeaseUntil = l.now().UTC().Add(l.length) })
	switch {
	case errors.Is(err, errCancelRequested):
		l.end(errCallerCancelled)
	case errors.Is(err, errLost):
		l.end(errLeaseLost)
		return false
	}
	// errUnsettled: the lease may still be ours; try again next time.
	return true
}
