package engine

import (
	"errors"
	"time"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/broker"
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

// ErrNothingToCancel: nothing of the execution is stored — no request in its
// queue, no record, no envelope — so a cancel has nothing to record on.
var ErrNothingToCancel = errors.New("no such execution")

// RecordCancel sets cancel-requested on an execution's record, creating a
// pending record when no worker has claimed the execution yet, so that it is
// cancelled whenever a worker sees it (decide). The worker running it sees
// the request at its next lease renewal, or at once through CancelLocal.
//
// Without a record, an execution whose envelope is stored has ended (an
// envelope outlives its record): the cancel changes nothing and says how it
// ended. Otherwise the pending record is created only when mayBeQueued: the
// caller looked for the request in its queue before this reads the record
// (a claim creates the record before it takes the request off the queue, so
// a request claimed meanwhile has a record by now), found it there, or could
// not tell. Else nothing is recorded: ErrNothingToCancel.
func (r *Runner) RecordCancel(principal, id string, mayBeQueued bool) (CancelRecorded, error) {
	key := broker.Key(principal, id)
	// Absences the leader confirms (broker.LoadCurrent): nothing to cancel
	// is a verdict, and a replica behind would make one of a record.
	loadEnvelope := func() *envelope.Envelope {
		ctx, cancel := StoreContext()
		defer cancel()
		env, _, err := broker.LoadCurrent[envelope.Envelope](ctx, r.w.b, r.w.b.Envelopes, key)
		if err != nil {
			return nil
		}
		return env
	}
	for try := 0; try < 20; try++ {
		ctx, cancel := StoreContext()
		rec, rev, err := broker.LoadCurrent[Record](ctx, r.w.b, r.w.b.Executions, key)
		cancel()
		now := r.w.now().UTC()
		switch {
		case errors.Is(err, broker.ErrNotFound):
			if env := loadEnvelope(); env != nil {
				return CancelRecorded{State: StateFinalized, Finalized: true, Status: env.Status}, nil
			}
			if !mayBeQueued {
				return CancelRecorded{}, ErrNothingToCancel
			}
			pending := &Record{V: envelope.Version, ExecutionID: id, State: StatePending, CancelRequested: true,
				CancelRequestedAt: now, CreatedAt: now, UpdatedAt: now}
			ctx, cancel := StoreContext()
			_, err = broker.Create(ctx, r.w.b.Executions, key, pending)
			cancel()
			if err == nil {
				return CancelRecorded{State: StatePending}, nil
			}
		case err != nil:
			time.Sleep(broker.Backoff(try))
		default:
			found := cancelFound(rec, loadEnvelope)
			if found != nil {
				return *found, nil
			}
			next := *rec
			next.CancelRequested, next.CancelRequestedAt, next.UpdatedAt = true, now, now
			ctx, cancel = StoreContext()
			_, err = broker.UpdateTTL(ctx, r.w.b.JS, r.w.b.Executions, key, &next, rev, r.w.store.ttl(&next))
			cancel()
			if err == nil {
				return CancelRecorded{State: rec.State}, nil
			}
		}
	}
	return CancelRecorded{}, errCancelNotRecorded
}

// cancelFound is what a cancel answers from the record it read, rec, and,
// only when the record does not tell, the execution's envelope (read by
// envelope: nil when there is none): the execution ended (a finalized
// record, or an envelope whatever the record says: a record is not written
// after its envelope, DESIGN §14), or a cancel recorded already. Nil: the
// cancel is to be recorded.
func cancelFound(rec *Record, envelope func() *envelope.Envelope) *CancelRecorded {
	switch {
	case rec.State == StateFinalized:
		return &CancelRecorded{State: rec.State, Finalized: true, Status: rec.Status}
	case rec.CancelRequested:
		return &CancelRecorded{State: rec.State}
	}
	if env := envelope(); env != nil {
		return &CancelRecorded{State: StateFinalized, Finalized: true, Status: env.Status}
	}
	return nil
}
