package executor

import (
	"encoding/json"
	"errors"
	"strings"
	"time"

	"github.com/capstan-dev/capstan/broker"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/delivery"
	"github.com/nats-io/nats.go"
)

// CancelReply answers a cancel request.
type CancelReply struct {
	ExecutionID string `json:"executionId"`
	// State is the record's state when the cancel was recorded.
	State State `json:"state,omitempty"`
	// Finalized is true when the execution has ended: before the cancel (which
	// then changed nothing), or already because of it, when the worker running
	// it stopped it before the cancel was recorded. Status says which.
	Finalized bool            `json:"finalized,omitempty"`
	Status    envelope.Status `json:"status,omitempty"`
	Error     string          `json:"error,omitempty"`
}

// serveControl subscribes to the core NATS requests workers serve.
func (w *Worker) serveControl() ([]*nats.Subscription, error) {
	n := w.b.Names
	var subs []*nats.Subscription
	add := func(s *nats.Subscription, err error) error {
		if err != nil {
			for _, s := range subs {
				_ = s.Unsubscribe()
			}
			return err
		}
		subs = append(subs, s)
		return nil
	}
	// One worker of the group records the cancel on the execution record ...
	if err := add(w.nc.QueueSubscribe(n.CancelSubjects(), n.WorkersQueue(), w.recordCancel)); err != nil {
		return nil, err
	}
	// ... and every worker stops its own run of it at once, if it has one:
	// on the request itself, and again on the notice sent once the cancel is
	// recorded, for a run that began between the two.
	stopLocal := func(m *nats.Msg) { w.run.CancelLocal(lastToken(m.Subject)) }
	if err := add(w.nc.Subscribe(n.CancelSubjects(), stopLocal)); err != nil {
		return nil, err
	}
	if err := add(w.nc.Subscribe(n.CancelNoticeSubjects(), stopLocal)); err != nil {
		return nil, err
	}
	if err := add(w.nc.QueueSubscribe(n.DescribeSubject(), n.WorkersQueue(), w.serveDescribe)); err != nil {
		return nil, err
	}
	return subs, nil
}

func lastToken(subject string) string {
	return subject[strings.LastIndexByte(subject, '.')+1:]
}

// recordCancel sets cancel-requested on the record, creating a pending record
// when no worker has claimed the execution yet, so it is cancelled whenever a
// worker sees it.
func (w *Worker) recordCancel(m *nats.Msg) {
	id := lastToken(m.Subject)
	reply := CancelReply{ExecutionID: id}
	defer func() {
		if reply.Error == "" && !reply.Finalized {
			_ = w.nc.Publish(w.b.Names.CancelNoticeSubject(id), nil)
		}
		b, _ := json.Marshal(reply)
		_ = m.Respond(b)
	}()
	if err := envelope.ValidExecutionID(id); err != nil {
		reply.Error = err.Error()
		return
	}
	for try := 0; try < 20; try++ {
		ctx, cancel := delivery.StoreContext()
		rec, rev, err := broker.Load[Record](ctx, w.b.Executions, id)
		cancel()
		now := time.Now().UTC()
		switch {
		case errors.Is(err, broker.ErrNotFound):
			pending := &Record{V: envelope.Version, ExecutionID: id, State: StatePending, CancelRequested: true,
				CancelRequestedAt: now, CreatedAt: now, UpdatedAt: now}
			ctx, cancel := delivery.StoreContext()
			_, err = broker.Create(ctx, w.b.Executions, id, pending)
			cancel()
			if err == nil {
				reply.State = StatePending
				return
			}
		case err != nil:
			time.Sleep(broker.Backoff(try))
		case rec.State == StateFinalized:
			reply.Finalized, reply.Status, reply.State = true, rec.Status, rec.State
			return
		case rec.CancelRequested:
			reply.State = rec.State
			return
		default:
			// The envelope is the truth: the record is marked finalized only
			// after it, so an execution can be over while its record says not.
			ctx, cancel := delivery.StoreContext()
			env, _, eerr := broker.Load[envelope.Envelope](ctx, w.b.Envelopes, id)
			cancel()
			if eerr == nil {
				reply.Finalized, reply.Status, reply.State = true, env.Status, StateFinalized
				return
			}
			next := *rec
			next.CancelRequested, next.CancelRequestedAt, next.UpdatedAt = true, now, now
			ctx, cancel = delivery.StoreContext()
			_, err = broker.Update(ctx, w.b.Executions, id, &next, rev)
			cancel()
			if err == nil {
				reply.State = rec.State
				return
			}
		}
	}
	reply.Error = "the cancel could not be recorded; try again"
}
