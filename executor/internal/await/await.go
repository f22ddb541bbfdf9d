package await

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Waiters hands envelopes to the calls of one client waiting for them. It
// holds one subscription to every republished envelope, never a JetStream
// consumer per call, and re-reads the envelopes it may have missed
// (failover.go).
type Waiters struct {
	b   *broker.Broker
	log *slog.Logger
	sub *nats.Subscription
	// principal is whose envelopes these are: the server delivers no other's.
	principal string

	mu      sync.Mutex
	waiters map[string]waiting
	ctx     context.Context
	stop    context.CancelFunc

	lastSeq   atomic.Uint64 // of the last republished envelope seen
	gap       chan struct{}
	watchDone chan struct{}
	// tick is closed, and replaced, every second by the watch (failover.go):
	// the waits look at the reconnects then, with no timer of their own.
	tick atomic.Pointer[chan struct{}]
}

// New opens the subscription to principal's envelopes in b and watches for
// missed ones until Close.
func New(b *broker.Broker, principal string, log *slog.Logger) (*Waiters, error) {
	c := &Waiters{b: b, log: log, principal: principal, waiters: map[string]waiting{},
		gap: make(chan struct{}, 1), watchDone: make(chan struct{})}
	c.ctx, c.stop = context.WithCancel(context.Background())
	tick := make(chan struct{})
	c.tick.Store(&tick)
	var err error
	c.sub, err = b.NC.Subscribe(b.Names.EnvelopeSubjectsOf(principal), c.onEnvelope)
	if err != nil {
		c.stop()
		return nil, fmt.Errorf("capstan: subscribe to envelopes: %w", err)
	}
	_ = c.sub.SetPendingLimits(-1, -1)
	go c.watchMissed()
	return c, nil
}

// ErrClosed ends a wait the Waiters' Close cut short: the request may still
// run, and its envelope can be awaited by id on another client.
var ErrClosed = errors.New("capstan: client closed while awaiting the envelope; the execution may still run")

// Close stops watching and releases the subscription; waits still pending
// end with ErrClosed.
func (c *Waiters) Close() error {
	c.stop()
	<-c.watchDone
	return c.sub.Unsubscribe()
}

func (c *Waiters) onEnvelope(m *nats.Msg) {
	key := c.b.Names.EnvelopeKeyFromSubject(m.Subject)
	// Only the server's republish of this very key: the server also sends
	// replies to any subject a requester names, and a direct get of another
	// key, answered here, would otherwise pass for this one's envelope.
	if !isKVSubject(m.Header.Get(jetstream.SubjectHeader), c.b.Names.EnvelopesBucket(), key) {
		return
	}
	c.noteSequence(m)
	_, id, _ := broker.ParseKey(key)
	c.mu.Lock()
	_, waited := c.waiters[id]
	c.mu.Unlock()
	if !waited {
		return
	}
	env, err := envelope.DecodeEnvelope(m.Data)
	if err != nil {
		c.log.Warn("envelope does not decode", "executionId", id, "err", err)
		return
	}
	if env.ExecutionID != id {
		c.log.Warn("envelope of another execution on this one's subject: ignored", "executionId", id, "envelopeOf", env.ExecutionID)
		return
	}
	c.deliver(id, env)
}

// isKVSubject reports whether subject is $KV.<bucket>.<key>, the subject
// of key's messages in bucket, compared in place.
func isKVSubject(subject, bucket, key string) bool {
	rest, ok := strings.CutPrefix(subject, "$KV.")
	if !ok {
		return false
	}
	if rest, ok = strings.CutPrefix(rest, bucket); !ok || len(rest) == 0 || rest[0] != '.' {
		return false
	}
	return rest[1:] == key
}

// waiting is who waits for an execution's envelope: nearly always one
// call (first), held in the map itself, with no slice made for it.
type waiting struct {
	since time.Time // when the first waiter came
	first chan *envelope.Envelope
	more  []chan *envelope.Envelope
}

// deliver hands env to every waiter of id, once.
func (c *Waiters) deliver(id string, env *envelope.Envelope) {
	c.mu.Lock()
	w, ok := c.waiters[id]
	delete(c.waiters, id)
	c.mu.Unlock()
	if !ok {
		return
	}
	w.first <- env
	for _, ch := range w.more {
		ch <- env
	}
}

// Add registers a waiter of an execution's envelope; Await, AwaitFresh or
// Remove end it.
func (c *Waiters) Add(id string) chan *envelope.Envelope {
	ch := make(chan *envelope.Envelope, 1)
	c.mu.Lock()
	if w, ok := c.waiters[id]; ok {
		w.more = append(w.more, ch)
		c.waiters[id] = w
	} else {
		c.waiters[id] = waiting{since: time.Now(), first: ch}
	}
	c.mu.Unlock()
	return ch
}

// Remove ends a waiter that will not be awaited.
func (c *Waiters) Remove(id string, ch chan *envelope.Envelope) {
	c.mu.Lock()
	defer c.mu.Unlock()
	w, ok := c.waiters[id]
	if !ok {
		return
	}
	if w.first == ch {
		if len(w.more) == 0 {
			delete(c.waiters, id)
			return
		}
		w.first, w.more = w.more[0], w.more[1:]
	} else if i := slices.Index(w.more, ch); i >= 0 {
		w.more = slices.Delete(w.more, i, i+1)
	}
	c.waiters[id] = w
}

// Await waits on ch, a waiter of id, until the envelope comes or ctx ends.
func (c *Waiters) Await(ctx context.Context, id string, ch chan *envelope.Envelope) (*envelope.Envelope, error) {
	// The envelope may have been written before the subscription saw the
	// waiter: one Get closes that race. It is bounded on its own: a request
	// lost with a server that went down is never answered, and the waiter's
	// re-reads cover a Get that failed. One stored that does not decode will
	// never be another (envelopes are written once): it is the answer.
	if env, err := c.Load(ctx, id); err == nil || errors.Is(err, envelope.ErrDecode) {
		c.Remove(id, ch)
		return env, err
	}
	return c.AwaitFresh(ctx, id, ch, c.Reconnects())
}

// Load reads an envelope with a bound of its own: a request lost with a
// server that went down is never answered. broker.ErrNotFound says there is
// none.
func (c *Waiters) Load(ctx context.Context, id string) (*envelope.Envelope, error) {
	lctx, cancel := context.WithTimeout(ctx, PublishTry)
	defer cancel()
	env, _, err := broker.Load[envelope.Envelope](lctx, c.b.Envelopes, broker.Key(c.principal, id))
	if err == nil {
		err = envelope.CheckVersion(env.V)
	}
	if err != nil {
		return nil, err
	}
	return env, nil
}

// AwaitFresh waits for the envelope of a request whose waiter was registered
// before it was published, under an id no earlier request had: its envelope
// can only arrive on the subscription, so no Get is needed, unless the
// connection reconnected since reconnects was read and the republished
// envelope was lost with it.
func (c *Waiters) AwaitFresh(ctx context.Context, id string, ch chan *envelope.Envelope, reconnects uint64) (*envelope.Envelope, error) {
	for {
		select {
		case env := <-ch:
			return env, nil
		case <-ctx.Done():
			c.Remove(id, ch)
			return nil, ctx.Err()
		case <-c.ctx.Done(): // closed: nothing will deliver it
			c.Remove(id, ch)
			return nil, ErrClosed
		case <-*c.tick.Load():
			if now := c.Reconnects(); now != reconnects {
				reconnects = now
				if env, err := c.Load(ctx, id); err == nil {
					c.Remove(id, ch)
					return env, nil
				}
			}
		}
	}
}

// Reconnects counts the connection's reconnects: an envelope republished
// during one may have been lost.
func (c *Waiters) Reconnects() uint64 { return c.b.NC.Stats().Reconnects }
