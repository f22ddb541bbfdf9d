package executor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/capstan-dev/capstan/broker"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ClientConfig configures a Client. Zero values are the defaults.
type ClientConfig struct {
	// Surface every call of this client comes from. Default SurfaceDirect.
	Surface Surface
	// Actor is the default actor of calls that name none.
	Actor envelope.Actor
	// Broker says how resources are named and provisioned.
	Broker broker.Config
	// Logger receives the client's logs. Default: discarded.
	Logger *slog.Logger
}

// Client submits execution requests and awaits their envelopes. It holds one
// subscription for every await, never a JetStream consumer per call.
type Client struct {
	cfg ClientConfig
	b   *broker.Broker
	cat *catalog
	sub *nats.Subscription

	mu      sync.Mutex
	waiters map[string][]chan *envelope.Envelope
	since   map[string]time.Time // when the first waiter of an id came
	ctx     context.Context
	stop    context.CancelFunc

	lastSeq   atomic.Uint64 // of the last republished envelope seen
	gap       chan struct{}
	watchDone chan struct{}
}

// ErrInvalidCapability is returned, wrapped in a CAPABILITY_NOT_FOUND
// CapabilityError, for an id that can never name a capability: it is refused
// before it reaches a subject.
var ErrInvalidCapability = errors.New("capstan: invalid capability id")

// NewClient provisions the resources (idempotently) and opens the client's one
// envelope subscription.
func NewClient(nc *nats.Conn, cfg ClientConfig) (*Client, error) {
	if nc == nil {
		return nil, errors.New("capstan: NewClient needs a NATS connection")
	}
	if cfg.Surface == "" {
		cfg.Surface = SurfaceDirect
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := broker.Provision(ctx, nc, cfg.Broker)
	if err != nil {
		return nil, err
	}
	c := &Client{cfg: cfg, b: b, waiters: map[string][]chan *envelope.Envelope{}, since: map[string]time.Time{},
		gap: make(chan struct{}, 1), watchDone: make(chan struct{})}
	c.ctx, c.stop = context.WithCancel(context.Background())
	c.sub, err = nc.Subscribe(b.Names.EnvelopeSubjects(), c.onEnvelope)
	if err != nil {
		c.stop()
		return nil, fmt.Errorf("capstan: subscribe to envelopes: %w", err)
	}
	_ = c.sub.SetPendingLimits(-1, -1)
	c.cat, err = watchCatalog(c.ctx, b)
	if err != nil {
		_ = c.sub.Unsubscribe()
		c.stop()
		return nil, err
	}
	go c.watchMissed()
	return c, nil
}

// Close releases the subscription and the catalog watcher.
func (c *Client) Close() error {
	c.cat.stop()
	c.stop()
	<-c.watchDone
	return c.sub.Unsubscribe()
}

// Broker exposes the provisioned resources (for tools and tests).
func (c *Client) Broker() *broker.Broker { return c.b }

func (c *Client) onEnvelope(m *nats.Msg) {
	c.noteSequence(m)
	id := c.b.Names.EnvelopeKeyFromSubject(m.Subject)
	c.mu.Lock()
	_, waited := c.waiters[id]
	c.mu.Unlock()
	if !waited {
		return
	}
	env, err := envelope.DecodeEnvelope(m.Data)
	if err != nil {
		c.cfg.Logger.Warn("envelope does not decode", "executionId", id, "err", err)
		return
	}
	c.deliver(id, env)
}

// deliver hands env to every waiter of id, once.
func (c *Client) deliver(id string, env *envelope.Envelope) {
	c.mu.Lock()
	ws := c.waiters[id]
	delete(c.waiters, id)
	delete(c.since, id)
	c.mu.Unlock()
	for _, w := range ws {
		w <- env
	}
}

// CallOption sets a field of one request.
type CallOption func(*envelope.Request)

// As sets the acting actor.
func As(a envelope.Actor) CallOption { return func(r *envelope.Request) { r.Actor = a } }

// WithID sets the execution id (default a new UUIDv7). Submitting twice with
// one id within the dedup window runs it once.
func WithID(id string) CallOption { return func(r *envelope.Request) { r.ExecutionID = id } }

// WithCorrelation sets the correlation id that ties executions together.
func WithCorrelation(id string) CallOption { return func(r *envelope.Request) { r.CorrelationID = id } }

// WithDeadline ends the whole execution as CANCELLED at t.
func WithDeadline(t time.Time) CallOption {
	return func(r *envelope.Request) { t := t.UTC(); r.Deadline = &t }
}

// WithApproval resumes an approved call (used by Resume).
func WithApproval(id string) CallOption { return func(r *envelope.Request) { r.ApprovalID = id } }

// WithTraceparent carries a W3C trace context.
func WithTraceparent(tp string) CallOption { return func(r *envelope.Request) { r.Traceparent = tp } }

// newRequest builds and checks a request.
func (c *Client) newRequest(capabilityID string, input any, opts []CallOption) (*envelope.Request, error) {
	raw, err := toRaw(input)
	if err != nil {
		return nil, err
	}
	r := &envelope.Request{
		V: envelope.Version, CapabilityID: capabilityID, Input: raw, Actor: c.cfg.Actor,
		Surface: string(c.cfg.Surface), SubmittedAt: time.Now().UTC(),
	}
	for _, o := range opts {
		o(r)
	}
	r.Surface = string(c.cfg.Surface) // the client fixes the surface, never the caller's payload
	if r.ExecutionID == "" {
		r.ExecutionID = envelope.NewExecutionID()
	}
	if err := envelope.ValidExecutionID(r.ExecutionID); err != nil {
		return nil, fmt.Errorf("capstan: %w", err)
	}
	if err := envelope.ValidCapabilityID(capabilityID); err != nil {
		return r, &envelope.CapabilityError{Code: envelope.CodeCapabilityNotFound, Stage: envelope.StageResolve,
			ExposeToModel: true, Message: "No such capability.", Cause: fmt.Errorf("%w: %v", ErrInvalidCapability, err)}
	}
	return r, nil
}

func toRaw(input any) (envelope.Raw, error) {
	switch v := input.(type) {
	case nil:
		return nil, nil
	case envelope.Raw:
		return v, nil
	case json.RawMessage:
		return envelope.RawFromJSON(v)
	default:
		r, err := envelope.NewRaw(v)
		if err != nil {
			return nil, fmt.Errorf("capstan: input does not encode: %w", err)
		}
		return r, nil
	}
}

// message turns a request into its JetStream message. A capability the catalog
// does not list goes to _unrouted, where a worker decides.
func (c *Client) message(r *envelope.Request) (*nats.Msg, error) {
	b, err := envelope.Marshal(r)
	if err != nil {
		return nil, err
	}
	subject := c.b.Names.UnroutedSubject()
	if _, ok := c.cat.lookup(r.CapabilityID); ok {
		subject = c.b.Names.ExecSubject(r.CapabilityID)
	}
	m := nats.NewMsg(subject)
	m.Data = b
	m.Header.Set(jetstream.MsgIDHeader, r.ExecutionID)
	return m, nil
}

// Submit publishes one execution request and returns its execution id once
// JetStream stored it. Submitting the same id again within the dedup window is
// a no-op.
func (c *Client) Submit(ctx context.Context, capabilityID string, input any, opts ...CallOption) (string, error) {
	r, err := c.newRequest(capabilityID, input, opts)
	if err != nil {
		return "", err
	}
	m, err := c.message(r)
	if err != nil {
		return "", err
	}
	if err := c.publish(ctx, m); err != nil {
		return "", fmt.Errorf("capstan: submit %s: %w", r.ExecutionID, err)
	}
	return r.ExecutionID, nil
}

// Await waits for an execution's envelope until ctx ends.
func (c *Client) Await(ctx context.Context, executionID string) (*envelope.Envelope, error) {
	ch := c.wait(executionID)
	return c.awaitOn(ctx, executionID, ch)
}

func (c *Client) wait(id string) chan *envelope.Envelope {
	ch := make(chan *envelope.Envelope, 1)
	c.mu.Lock()
	if _, ok := c.since[id]; !ok {
		c.since[id] = time.Now()
	}
	c.waiters[id] = append(c.waiters[id], ch)
	c.mu.Unlock()
	return ch
}

func (c *Client) unwait(id string, ch chan *envelope.Envelope) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ws := c.waiters[id]
	for i, w := range ws {
		if w == ch {
			ws = append(ws[:i], ws[i+1:]...)
			break
		}
	}
	if len(ws) == 0 {
		delete(c.waiters, id)
		delete(c.since, id)
	} else {
		c.waiters[id] = ws
	}
}

func (c *Client) awaitOn(ctx context.Context, id string, ch chan *envelope.Envelope) (*envelope.Envelope, error) {
	// The envelope may have been written before the subscription saw the
	// waiter: one Get closes that race. It is bounded on its own: a request
	// lost with a server that went down is never answered, and the waiter's
	// re-reads cover a Get that failed.
	if env, err := c.loadEnvelope(ctx, id); err == nil {
		c.unwait(id, ch)
		return env, nil
	}
	return c.awaitFresh(ctx, id, ch, c.reconnects())
}

// loadEnvelope reads an envelope with a bound of its own: a request lost with
// a server that went down is never answered.
func (c *Client) loadEnvelope(ctx context.Context, id string) (*envelope.Envelope, error) {
	lctx, cancel := context.WithTimeout(ctx, publishTry)
	defer cancel()
	env, _, err := broker.Load[envelope.Envelope](lctx, c.b.Envelopes, id)
	return env, err
}

// awaitFresh waits for the envelope of a request whose waiter was registered
// before it was published, under an id no earlier request had: its envelope
// can only arrive on the subscription, so no Get is needed, unless the
// connection reconnected since reconnects was read and the republished
// envelope was lost with it.
func (c *Client) awaitFresh(ctx context.Context, id string, ch chan *envelope.Envelope, reconnects uint64) (*envelope.Envelope, error) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case env := <-ch:
			return env, nil
		case <-ctx.Done():
			c.unwait(id, ch)
			return nil, ctx.Err()
		case <-t.C:
			if now := c.reconnects(); now != reconnects {
				reconnects = now
				if env, err := c.loadEnvelope(ctx, id); err == nil {
					c.unwait(id, ch)
					return env, nil
				}
			}
		}
	}
}

func (c *Client) reconnects() uint64 { return c.b.NC.Stats().Reconnects }

// Call submits and awaits. err reports transport trouble only; governed
// outcomes (completed, failed, cancelled, approval-required) are in the
// envelope. An id that can never name a capability is refused here, as a
// failed CAPABILITY_NOT_FOUND envelope that was never published.
func (c *Client) Call(ctx context.Context, capabilityID string, input any, opts ...CallOption) (*envelope.Envelope, error) {
	envs, errs := c.CallMany(ctx, []Request{{CapabilityID: capabilityID, Input: input, Options: opts}})
	return envs[0], errs[0]
}

// Request is one call of a fan-out.
type Request struct {
	CapabilityID string
	Input        any
	Options      []CallOption
}

// CallMany submits every request at once and awaits every envelope. The
// results are in the order of reqs; errs[i] is set only for transport trouble
// of reqs[i].
func (c *Client) CallMany(ctx context.Context, reqs []Request) ([]*envelope.Envelope, []error) {
	envs := make([]*envelope.Envelope, len(reqs))
	errs := make([]error, len(reqs))
	type pending struct {
		i   int
		id  string
		m   *nats.Msg
		ch  chan *envelope.Envelope
		ack jetstream.PubAckFuture
		// fresh: the client made the id and the stream took the request as
		// new, so no envelope existed before the waiter.
		fresh bool
	}
	sent := make([]pending, 0, len(reqs))
	reconnects := c.reconnects()
	for i, rq := range reqs {
		r, err := c.newRequest(rq.CapabilityID, rq.Input, rq.Options)
		if err != nil {
			var ce *envelope.CapabilityError
			if errors.As(err, &ce) {
				envs[i] = refused(rq.CapabilityID, r, ce)
			} else {
				errs[i] = err
			}
			continue
		}
		m, err := c.message(r)
		if err != nil {
			errs[i] = err
			continue
		}
		ch := c.wait(r.ExecutionID)
		f, err := c.b.JS.PublishMsgAsync(m, jetstream.WithStallWait(30*time.Second)) // a large fan-out waits for room
		if err != nil {
			f = nil // published again below, synchronously
		}
		sent = append(sent, pending{i: i, id: r.ExecutionID, m: m, ch: ch, ack: f, fresh: ownID(rq.Options)})
	}
	ackWaitOver := make(chan struct{})
	ackWait := time.AfterFunc(asyncAckWait, func() { close(ackWaitOver) })
	defer ackWait.Stop()
	for k := range sent {
		p := &sent[k]
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
			err = c.publish(ctx, p.m)
		}
		if err != nil {
			c.unwait(p.id, p.ch)
			errs[p.i] = fmt.Errorf("capstan: submit %s: %w", p.id, err)
		}
	}
	for _, p := range sent {
		if errs[p.i] != nil {
			continue
		}
		switch {
		case p.fresh:
			envs[p.i], errs[p.i] = c.awaitFresh(ctx, p.id, p.ch, reconnects)
		default:
			envs[p.i], errs[p.i] = c.awaitOn(ctx, p.id, p.ch)
		}
	}
	return envs, errs
}

// ownID reports whether the client makes the request's id: no option sets
// one. A caller's id may be one whose envelope already exists.
func ownID(opts []CallOption) bool {
	var r envelope.Request
	for _, o := range opts {
		o(&r)
	}
	return r.ExecutionID == ""
}

func refused(capabilityID string, r *envelope.Request, ce *envelope.CapabilityError) *envelope.Envelope {
	id := ""
	if r != nil {
		id = r.ExecutionID
	}
	return &envelope.Envelope{V: envelope.Version, ExecutionID: id, CapabilityID: capabilityID,
		Status: envelope.StatusFailed, Error: ce.Wire(), FinalizedAt: time.Now().UTC()}
}

// Status is what the runtime knows of one execution.
type Status struct {
	Record   *Record            `json:"record,omitempty"`
	Envelope *envelope.Envelope `json:"envelope,omitempty"`
}

// ErrUnknownExecution: neither a record nor an envelope exists for the id.
var ErrUnknownExecution = errors.New("capstan: no such execution")

// Status reads the execution record and the envelope.
func (c *Client) Status(ctx context.Context, executionID string) (*Status, error) {
	if err := envelope.ValidExecutionID(executionID); err != nil {
		return nil, fmt.Errorf("capstan: %w", err)
	}
	var s Status
	rec, _, err := broker.Load[Record](ctx, c.b.Executions, executionID)
	if err != nil && !errors.Is(err, broker.ErrNotFound) {
		return nil, err
	}
	s.Record = rec
	env, _, err := broker.Load[envelope.Envelope](ctx, c.b.Envelopes, executionID)
	if err != nil && !errors.Is(err, broker.ErrNotFound) {
		return nil, err
	}
	s.Envelope = env
	if s.Record == nil && s.Envelope == nil {
		return nil, fmt.Errorf("%w: %s", ErrUnknownExecution, executionID)
	}
	return &s, nil
}

// ErrNoWorkers: no worker answered a request only workers serve.
var ErrNoWorkers = errors.New("capstan: no worker is serving")

// Cancel asks the workers to cancel an execution. Cancelling is terminal at any
// point: before a claim, during an attempt, during a backoff.
func (c *Client) Cancel(ctx context.Context, executionID string) (*CancelReply, error) {
	if err := envelope.ValidExecutionID(executionID); err != nil {
		return nil, fmt.Errorf("capstan: %w", err)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
	}
	m, err := c.b.NC.RequestWithContext(ctx, c.b.Names.CancelSubject(executionID), nil)
	if errors.Is(err, nats.ErrNoResponders) {
		return nil, fmt.Errorf("%w: cancel %s", ErrNoWorkers, executionID)
	}
	if err != nil {
		return nil, fmt.Errorf("capstan: cancel %s: %w", executionID, err)
	}
	var r CancelReply
	if err := json.Unmarshal(m.Data, &r); err != nil {
		return nil, fmt.Errorf("capstan: cancel %s: bad reply: %w", executionID, err)
	}
	if r.Error != "" {
		return &r, fmt.Errorf("capstan: cancel %s: %s", executionID, r.Error)
	}
	return &r, nil
}
