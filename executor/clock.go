package executor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/capstan-dev/capstan/internal/broker"
)

// Leases, deadlines and the record window are judged by each worker's clock
// (DESIGN §5): a worker whose clock is ahead of another's takes that
// worker's live attempts for lost ones, and one behind keeps a lost attempt
// for live. A live lease keeps at least two thirds of its length, so that
// workers within a third of a lease of each other never misjudge one: each
// worker keeps within a sixth of its lease of the server's clock, which
// every worker compares its own with as it starts and at every renewal of
// the catalog.

// maxClockOffset is how far a worker's clock may be from the server's.
func maxClockOffset(lease time.Duration) time.Duration { return lease / 6 }

// clock is the worker's clock.
func (w *Worker) clock() time.Time {
	if c := w.cfg.knobs.Clock; c != nil {
		return c()
	}
	return time.Now()
}

// checkClock compares the worker's clock with the server's, and fails when
// it is further from it than maxClockOffset.
func (w *Worker) checkClock(ctx context.Context) error {
	offset, margin, err := w.b.ClockOffset(ctx, w.clock)
	if err != nil {
		if broker.Unreachable(err) {
			return err // waited for as every step of the start is
		}
		// A server that does not say its time, or credentials that may not
		// ask it: nothing to compare with.
		w.log.Warn("clock not compared with the server's", "err", err)
		return nil
	}
	bound := maxClockOffset(w.cfg.Lease)
	off := offset.Abs() - margin
	if off <= bound {
		return nil
	}
	way := "behind"
	if offset < 0 {
		way = "ahead of"
	}
	return fmt.Errorf("%w: this machine's clock is %s %s the NATS server's (to within %s): a worker more than %s "+
		"(a sixth of its lease) off takes other workers' live attempts for lost ones, or keeps lost ones; "+
		"synchronise the clock (NTP) and start the worker again",
		errClockOff, offset.Abs().Round(time.Millisecond), way, margin.Round(time.Millisecond), bound)
}

// errClockOff marks checkClock's error of a clock found off.
var errClockOff = errors.New("capstan: clock off")

// watchClock is checkClock once the worker runs: a clock that drifted is
// logged as an error, every time it is found off, and the worker goes on.
func (w *Worker) watchClock(ctx context.Context) {
	// A server that did not answer compared nothing: the next renewal
	// tries again.
	if err := w.checkClock(ctx); errors.Is(err, errClockOff) {
		w.log.Error("clock off", "err", err)
	}
}
