package await

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Call is one request of a fan-out, from its publication to its envelope.
type Call struct {
	id  string
	m   *nats.Msg
	ch  chan *envelope.Envelope
	ack jetstream.PubAckFuture
	// fresh: the client made the id and the stream took the request as new,
	// so no envelope existed before the waiter.
	fresh bool
	err   error
	// settled: published and acknowledged already (SendSync).
	settled bool
}

// ID is the call's execution id.
func (p *Call) ID() string { return p.id }

// Send registers a waiter of the execution id and publishes its request m
// without waiting for the acknowledgement (Settle waits). fresh says that the
// client made the id: a caller's id may be one whose envelope already exists.
func (c *Waiters) Send(id string, m *nats.Msg, fresh bool) *Call {
	call := &Call{id: id, m: m, ch: c.Add(id), fresh: fresh}
	f, err := c.b.JS.PublishMsgAsync(m, jetstream.WithStallWait(30*time.Second)) // a large fan-out waits for room
	if err == nil {
		call.ack = f // else published again by Settle, synchronously
	}
	return call
}

// SendSync registers a waiter of the execution id, publishes its request m
// and waits for the acknowledgement (through a failover, as Publish does):
// one call on its own needs no acknowledgement in flight while it sends
// others. Settle skips the call.
func (c *Waiters) SendSync(ctx context.Context, id string, m *nats.Msg, fresh bool) *Call {
	call := &Call{id: id, m: m, ch: c.Add(id), settled: true}
	ack, err := Publish(ctx, c.b.NC, m, c.log)
	if err != nil {
		c.Remove(id, call.ch)
		call.err = fmt.Errorf("capstan: submit %s: %w", id, err)
		return call
	}
	call.fresh = fresh && !ack.Duplicate
	return call
}

// Settle waits for the acknowledgement of every call sent (nil calls are
// skipped). A publish that failed, or stayed unanswered for AsyncAckWait, is
// published again under its id (Publish); a call whose request could not be
// stored stops waiting and keeps its error for Wait.
func (c *Waiters) Settle(ctx context.Context, calls []*Call) {
	// The wait for acknowledgements is armed at the first call not settled
	// yet: a call on its own (SendSync) was settled as it was sent.
	var ackWaitOver chan struct{}
	for _, p := range calls {
		if p == nil || p.settled {
			continue
		}
		if ackWaitOver == nil {
			over := make(chan struct{})
			ackWait := time.AfterFunc(AsyncAckWait, func() { close(over) })
			defer ackWait.Stop()
			ackWaitOver = over
		}
		var err error
		if p.ack == nil {
			err = errors.New("not published")
		} else {
			select {
			case ack := <-p.ack.Ok():
				p.fresh = p.fresh && !ack.Duplicate
				continue
			case err = <-p.ack.Err():
			case <-ackWaitOver:
				// Unanswered: its stream may have lost its leader.
				err = errors.New("no acknowledgement")
			case <-ctx.Done():
				err = ctx.Err()
			}
		}
		// A failed or unanswered publish is published again under its id.
		// Whether the first one was stored is unknown: the await reads first.
		p.fresh = false
		if ctx.Err() == nil {
			_, err = Publish(ctx, c.b.NC, p.m, c.log)
		}
		if err != nil {
			c.Remove(p.id, p.ch)
			p.err = fmt.Errorf("capstan: submit %s: %w", p.id, err)
		}
	}
}

// Wait awaits a settled call's envelope; reconnects is Reconnects as read
// before the call was sent.
func (c *Waiters) Wait(ctx context.Context, p *Call, reconnects uint64) (*envelope.Envelope, error) {
	switch {
	case p.err != nil:
		return nil, p.err
	case p.fresh:
		return c.AwaitFresh(ctx, p.id, p.ch, reconnects)
	}
	return c.Await(ctx, p.id, p.ch)
}
