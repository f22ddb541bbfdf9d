package delivery

import (
	"errors"
	"time"

	"github.com/capstan-dev/capstan/broker"
	"github.com/capstan-dev/capstan/envelope"
)

// CancelRecorded is what recording a cancel found.
type CancelRecorded struct {
	// State is the record's state when the cancel was recorded.
	State State
	// Finalized: the execution had ended, before the cancel (which then
	// changed nothing) or because of it; Status is its envelope's.
	Finalized bool
	Status    envelope.Status
}

// errCancelNotRecorded: the store did not let the cancel be recorded.
var errCancelNotRecorded = errors.New("the cancel could not be recorded; try again")

// RecordCancel sets cancel-requested on an execution's record, creating a
// pending record when no worker has claimed the execution yet, so that it is
// cancelled whenever a worker sees it (decide). The worker running it sees
// the request at its next lease renewal, or at once through CancelLocal.
func (w *Runner) RecordCancel(principal, id string) (CancelRecorded, error) {
	key := broker.Key(principal, id)
	for try := 0; try < 20; try++ {
		ctx, cancel := StoreContext()
		rec, rev, err := broker.Load[Record](ctx, w.b.Executions, key)
		cancel()
		now := w.now().UTC()
		switch {
		case errors.Is(err, broker.ErrNotFound):
			pending := &Record{V: envelope.Version, ExecutionID: id, State: StatePending, CancelRequested: true,
				CancelRequestedAt: now, CreatedAt: now, UpdatedAt: now}
			ctx, cancel := StoreContext()
			_, err = broker.Create(ctx, w.b.Executions, key, pending)
			cancel()
			if err == nil {
				return CancelRecorded{State: StatePending}, nil
			}
		case err != nil:
			time.Sleep(broker.Backoff(try))
		case rec.State == StateFinalized:
			return CancelRecorded{State: rec.State, Finalized: true, Status: rec.Status}, nil
		case rec.CancelRequested:
			return CancelRecorded{State: rec.State}, nil
		default:
			// The envelope is the truth: the record is marked finalized only
			// after it, so an execution can be over while its record says not.
			ctx, cancel := StoreContext()
			env, _, eerr := broker.Load[envelope.Envelope](ctx, w.b.Envelopes, key)
			cancel()
			if eerr == nil {
				return CancelRecorded{State: StateFinalized, Finalized: true, Status: env.Status}, nil
			}
			next := *rec
			next.CancelRequested, next.CancelRequestedAt, next.UpdatedAt = true, now, now
			ctx, cancel = StoreContext()
			_, err = broker.UpdateTTL(ctx, w.b.JS, w.b.Executions, key, &next, rev, w.store.ttl(&next))
			cancel()
			if err == nil {
				return CancelRecorded{State: rec.State}, nil
			}
		}
	}
	return CancelRecorded{}, errCancelNotRecorded
}
