package executor

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"time"

	"github.com/capstan-dev/capstan/execution"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor/internal/await"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/execrpc"
	"github.com/capstan-dev/capstan/observe"
)

// ClientConfig configures a Client. Zero values are the defaults.
type ClientConfig struct {
	// Surface every call of this client comes from. Default SurfaceDirect.
	Surface Surface
	// Actor is the default actor of calls that name none.
	Actor envelope.Actor
	// Deployment says how resources are named. A client never provisions: a
	// server, an admin or a worker creates the resources first.
	Deployment Deployment
	// Logger receives the client's logs. Default: discarded.
	Logger *slog.Logger
	// Observer is told of every request the client submits, for metrics and
	// traces (see package telemetry). Default: nothing is observed.
	Observer observe.Client
	// Unserved is what a call does when no live worker serves its
	// capability: UnservedQueue (the default) stores it and says so at once
	// with an *UnservedError; UnservedRefuse stores nothing; UnservedWait
	// waits for a worker.
	Unserved Unserved
	// StartWithin is how long a request may wait for a worker to start it
	// before it ends NOT_STARTED (DESIGN §13). Default 24 h,
	// and never more than the envelope retention (Deployment.EnvelopeRetention)
	// less a margin of an hour (a tenth of it, under ten hours), so that every
	// envelope outlives its request's start deadline: a longer window, here or
	// in a call's StartWithin option, is cut to it (with the default 25 h
	// retention, to the default 24 h).
	StartWithin time.Duration
}

// defaultStartWithin is how long a request waits to be started by default.
const defaultStartWithin = 24 * time.Hour

// Client submits execution requests and awaits their envelopes. It holds one
// subscription for every await, never a JetStream consumer per call; it
// rides out a failover of the servers (executor/internal/await).
type Client struct {
	cfg ClientConfig
	b   *broker.Broker
	// cat is the watched catalog of an anonymous client; probe reads a
	// principal's catalog entries by key.
	probe *catalogProbe
	// principal is who the server knows this connection as (see
	// broker.PrincipalOf): every subject it publishes to carries it.
	principal string
	// ids makes the message ids of its requests (broker.MsgIDs).
	ids broker.MsgIDs
	cat *catalog
	w   *await.Waiters
	// maxStart caps every request's start window (0: the retention was not
	// readable, no cap).
	maxStart time.Duration

	ctx  context.Context // the catalog watcher's
	stop context.CancelFunc
}

// ErrInvalidCapability is returned, wrapped in a CAPABILITY_NOT_FOUND
// CapabilityError, for an id that can never name a capability: it is refused
// before it reaches a subject.
var ErrInvalidCapability = errors.New("capstan: invalid capability id")

// NewClient opens the existing resources (it never creates any: that is the
// work of servers, admins and workers) and the client's one envelope
// subscription. The client acts as the connection's principal: the one whose
// credentials it connected with (broker.Connect), or the anonymous principal
// of an open server.
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
	if cfg.Observer == nil {
		cfg.Observer = observe.NopClient{}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	principal := broker.PrincipalOf(nc, broker.NewNames(cfg.Deployment.Prefix))
	// A principal reads its own envelopes and records and the catalog; on an
	// open server everything is readable, approvals and the trail included.
	open := broker.Open
	if principal == broker.Anonymous {
		open = broker.OpenAll
	}
	b, err := openResources(ctx, nc, cfg.Deployment.config(), open)
	if err != nil {
		return nil, err
	}
	ids, err := broker.NewMsgIDs(nc)
	if err != nil {
		return nil, err
	}
	c := &Client{cfg: cfg, b: b, principal: principal, ids: ids}
	c.readRetention(ctx)
	c.ctx, c.stop = context.WithCancel(context.Background())
	if c.w, err = await.New(b, c.principal, cfg.Logger); err != nil {
		c.stop()
		return nil, err
	}
	if c.principal != broker.Anonymous {
		// A principal may not create consumers (a push consumer's deliveries
		// could be aimed at any subject): it reads catalog entries by key.
		c.probe = &catalogProbe{live: map[string]time.Time{}}
		return c, nil
	}
	c.cat, err = watchCatalog(c.ctx, b, 0, func(key string, err error) {
		cfg.Logger.Warn("catalog entry does not decode: skipped", "bucket", b.Names.CatalogBucket(), "key", key, "err", err)
	})
	if err != nil {
		_ = c.w.Close()
		c.stop()
		return nil, err
	}
	return c, nil
}

// openResources opens the buckets a client reads, waiting (within ctx) for a
// server or a worker starting alongside to create them.
func openResources(ctx context.Context, nc *nats.Conn, cfg broker.Config,
	open func(context.Context, *nats.Conn, broker.Config) (*broker.Broker, error)) (*broker.Broker, error) {
	for try := 0; ; try++ {
		b, err := open(ctx, nc, cfg)
		if err == nil || !errors.Is(err, jetstream.ErrBucketNotFound) {
			return b, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(broker.Backoff(try)):
		}
	}
}

// readRetention reads how long the envelopes bucket keeps envelopes, which
// caps every request's start window.
func (c *Client) readRetention(ctx context.Context) {
	retention, err := c.envelopeRetention(ctx)
	if err != nil {
		c.cfg.Logger.Warn("envelope retention unreadable: start windows are not capped by it", "err", err)
		return
	}
	c.b.Config.EnvelopeRetention = retention
	c.maxStart = broker.MaxStartWithin(retention)
	if want := cmp.Or(c.cfg.StartWithin, defaultStartWithin); want > c.maxStart {
		c.cfg.Logger.Info("start window cut below the envelope retention", "startWithin", want,
			"envelopeRetention", retention, "cutTo", c.maxStart)
	}
}

// envelopeRetention reads the envelopes bucket's TTL: how long an envelope is
// kept, whatever the default.
func (c *Client) envelopeRetention(ctx context.Context) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, await.PublishTry)
	defer cancel()
	return c.b.EnvelopeRetention(ctx)
}

// capStartBy cuts a request's start deadline to the client's longest start
// window.
func (c *Client) capStartBy(r *envelope.Request) {
	if c.maxStart <= 0 || r.StartBy == nil {
		return
	}
	if latest := r.SubmittedAt.Add(c.maxStart).UTC(); r.StartBy.After(latest) {
		cut := latest // on the heap only when it cuts
		r.StartBy = &cut
	}
}

// Close releases the subscription and the catalog watcher.
func (c *Client) Close() error {
	if c.cat != nil {
		c.cat.stop()
	}
	c.stop()
	return c.w.Close()
}

// ErrClosed ends a call or an await still waiting when the client was closed:
// the execution may still run, and another client can await its id. A call,
// submit or resume made after Close ends with it at once, unpublished.
var ErrClosed = await.ErrClosed

// closed returns ErrClosed once Close was called: a closed client submits
// nothing.
func (c *Client) closed() error {
	if c.ctx.Err() != nil {
		return ErrClosed
	}
	return nil
}

// Conn is the NATS connection the client was made with.
func (c *Client) Conn() *nats.Conn { return c.b.NC }

// EnvelopeRetention is how long the envelopes bucket keeps an envelope, as
// the client read it when it opened (broker.DefaultEnvelopeRetention when it
// could not): how long an execution's outcome can be awaited.
func (c *Client) EnvelopeRetention() time.Duration {
	if r := c.b.Config.EnvelopeRetention; r > 0 {
		return r
	}
	return broker.DefaultEnvelopeRetention
}

// Principal is who the client acts as.
func (c *Client) Principal() string { return c.principal }

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

// StartWithin sets how long this request may wait for a worker to start it
// (default the client's StartWithin); past it, it ends NOT_STARTED. It is cut
// as the client's is (ClientConfig.StartWithin).
func StartWithin(d time.Duration) CallOption {
	return func(r *envelope.Request) { t := r.SubmittedAt.Add(d).UTC(); r.StartBy = &t }
}

// WithApproval resumes an approved call (used by Resume).
func WithApproval(id string) CallOption { return func(r *envelope.Request) { r.ApprovalID = id } }

// WithTraceparent carries a W3C trace context.
func WithTraceparent(tp string) CallOption { return func(r *envelope.Request) { r.Traceparent = tp } }

// newRequest builds and checks a request; own reports that the client made
// its id (no option set one): a caller's id may be one whose envelope
// already exists.
func (c *Client) newRequest(capabilityID string, input any, opts []CallOption) (_ *envelope.Request, own bool, _ error) {
	raw, err := toRaw(input)
	if err != nil {
		return nil, false, err
	}
	// The request and its default start deadline are one allocation.
	rs := &struct {
		r       envelope.Request
		startBy time.Time
	}{r: envelope.Request{
		V: envelope.Version, CapabilityID: capabilityID, Input: raw, Actor: c.cfg.Actor,
		Surface: string(c.cfg.Surface), SubmittedAt: time.Now().UTC(),
	}}
	r := &rs.r
	rs.startBy = c.defaultStartBy(r.SubmittedAt)
	r.StartBy = &rs.startBy
	for _, o := range opts {
		o(r)
	}
	c.capStartBy(r)
	r.Surface = string(c.cfg.Surface) // the client fixes the surface, never the caller's payload
	if own = r.ExecutionID == ""; own {
		r.ExecutionID = envelope.NewExecutionID()
	}
	if err := envelope.ValidExecutionID(r.ExecutionID); err != nil {
		return nil, false, fmt.Errorf("capstan: %w", err)
	}
	if err := envelope.ValidCapabilityID(capabilityID); err != nil {
		return r, own, &envelope.CapabilityError{Code: envelope.CodeCapabilityNotFound, Stage: envelope.StageResolve,
			ExposeToModel: true, Message: "No such capability.", Cause: fmt.Errorf("%w: %v", ErrInvalidCapability, err)}
	}
	return r, own, nil
}

// defaultStartBy is the client's start deadline of a request submitted at
// submitted; StartWithin overrides it.
func (c *Client) defaultStartBy(submitted time.Time) time.Time {
	d := c.cfg.StartWithin
	if d <= 0 {
		d = defaultStartWithin
	}
	return submitted.Add(d).UTC()
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
// does not list goes to _unrouted, where a worker decides. unserved is set
// when no live worker serves it (see place).
func (c *Client) message(ctx context.Context, r *envelope.Request) (m *nats.Msg, unserved *UnservedError, err error) {
	b, err := envelope.Marshal(r)
	if err != nil {
		return nil, nil, err
	}
	var subject string
	p := c.placeWithin(ctx, r.CapabilityID, unservedGrace)
	if p.listed {
		subject = c.b.Names.ExecSubject(c.principal, r.CapabilityID)
	} else {
		subject = c.b.Names.UnroutedSubject(c.principal)
	}
	if u := p.unserved; u != nil {
		u.ExecutionID = r.ExecutionID
		if r.StartBy != nil {
			u.StartBy = *r.StartBy
		}
	}
	m = nats.NewMsg(subject)
	m.Data = b
	m.Header.Set(jetstream.MsgIDHeader, c.ids.Request(c.principal, r.ExecutionID))
	return m, p.unserved, nil
}

// Serving returns an *UnservedError when no live worker serves the
// capability, as a call would find before it publishes; nil when one does,
// when workers answer for it (an unknown capability ends CAPABILITY_NOT_FOUND),
// or when the catalog cannot be read.
func (c *Client) Serving(ctx context.Context, capabilityID string) error {
	if u := c.placeWithin(ctx, capabilityID, unservedGrace).unserved; u != nil {
		return u
	}
	return nil
}

// unservedGrace is how long a capability may look unserved before a call is
// told so: a worker starting alongside the caller lists its capabilities
// within it.
const unservedGrace = 500 * time.Millisecond

// placeWithin is place, asked again every tenth of grace while the
// capability looks unserved, until grace has passed or ctx ends.
func (c *Client) placeWithin(ctx context.Context, id string, grace time.Duration) placement {
	p := c.place(ctx, id)
	if p.unserved == nil || c.cfg.Unserved == UnservedWait {
		return p
	}
	deadline := time.Now().Add(grace)
	for p.unserved != nil && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return p
		case <-time.After(grace / 10):
		}
		// A read that fails tells nothing: the capability stays unserved
		// until a read finds a worker for it.
		if next := c.place(ctx, id); !next.unread {
			p = next
		}
	}
	return p
}

// Submit publishes one execution request and returns its execution id once
// JetStream stored it. Submitting the same id again within the dedup window is
// a no-op.
func (c *Client) Submit(ctx context.Context, capabilityID string, input any, opts ...CallOption) (string, error) {
	if err := c.closed(); err != nil {
		return "", err
	}
	r, _, err := c.newRequest(capabilityID, input, opts)
	if err != nil {
		return "", err
	}
	end := c.cfg.Observer.Call(ctx, r)
	m, unserved, err := c.message(ctx, r)
	if err == nil && unserved != nil && c.cfg.Unserved == UnservedRefuse {
		err = unserved
		end(nil, err)
		return "", err
	}
	if err == nil {
		err = c.publish(ctx, m)
	}
	if full := broker.AsQueueFull(err); full != nil {
		err = c.quotaError(ctx, full)
	}
	end(nil, err)
	if err != nil {
		return "", fmt.Errorf("capstan: submit %s: %w", r.ExecutionID, err)
	}
	return r.ExecutionID, nil
}

// quotaLookup bounds how long a refusal of a full queue waits for the
// workers to say the queue's limit.
const quotaLookup = 2 * time.Second

// quotaError is the QUOTA_EXCEEDED refusal of a request its principal's full
// queue did not take (DESIGN §12 "Quotas"), with the queue's limit as the
// workers read it (absent when none answered in time).
func (c *Client) quotaError(ctx context.Context, full *broker.QueueFullError) *envelope.CapabilityError {
	limit := int64(-1)
	qctx, cancel := context.WithTimeout(ctx, quotaLookup)
	defer cancel()
	if u, err := c.Queue(qctx); err == nil {
		limit = broker.QueueLimit(*u, full.Quota)
	}
	return full.QuotaError(limit)
}

// Await waits for an execution's envelope until ctx ends, handing its
// progress to the callback of WithProgress, if ctx has one. An id that can
// never name an execution (envelope.ValidExecutionID) is refused at once. An execution whose
// envelope is no longer kept fails at once with an *ExpiredError
// (errors.Is(err, ErrExpired)): see ExpiredError for when. An id of which
// nothing is stored, as the workers tell (no request in its queue, no record,
// no envelope), fails at once with ErrNoSuchExecution; an id made less than
// two seconds ago (its request may be on its way) once it is two seconds old.
func (c *Client) Await(ctx context.Context, executionID string) (*envelope.Envelope, error) {
	// An id that can never name an execution has no envelope to wait for.
	if err := envelope.ValidExecutionID(executionID); err != nil {
		return nil, fmt.Errorf("capstan: %w", err)
	}
	progress := c.progressFor(ctx, 1) // nil unless WithProgress asked
	defer progress.stop()
	progress.follow(executionID)
	ch := c.w.Add(executionID)
	// Stored before the waiter, its envelope comes on no subscription: a
	// replica behind must not make it wait for ever.
	env, err := c.loadEnvelope(ctx, c.principal, executionID)
	if err == nil || errors.Is(err, envelope.ErrDecode) {
		// One stored that does not decode will never be another: envelopes
		// are written once.
		c.w.Remove(executionID, ch)
		return env, err
	}
	if errors.Is(err, broker.ErrNotFound) {
		if xerr := c.expired(ctx, c.principal, executionID); xerr != nil {
			c.w.Remove(executionID, ch)
			return nil, xerr
		}
		if young := youngFor(executionID); young > 0 {
			// Its request may be on its way: the workers are asked once
			// the id is old enough, while the wait goes on.
			return c.awaitAsking(ctx, executionID, ch, young)
		}
		switch state, answered := c.probeState(ctx, executionID); {
		case answered && state == ExecUnknown:
			c.w.Remove(executionID, ch)
			return nil, noSuchExecution(executionID)
		case answered && state == ExecEnded:
			// The workers read its envelope where this client's replica
			// did not.
			c.w.Remove(executionID, ch)
			return c.loadEnded(ctx, c.principal, executionID)
		}
	}
	// The waiter was registered before the read: an envelope stored since
	// comes on the subscription.
	return c.w.AwaitFresh(ctx, executionID, ch, c.w.Reconnects())
}

// loadEnvelope reads owner's envelope of executionID as Await and Status
// do, an absence confirmed where the reads may lag (broker.LoadCurrent).
func (c *Client) loadEnvelope(ctx context.Context, owner, executionID string) (*envelope.Envelope, error) {
	lctx, cancel := context.WithTimeout(ctx, await.PublishTry)
	defer cancel()
	env, _, err := broker.LoadCurrent[envelope.Envelope](lctx, c.b, c.b.Envelopes, broker.Key(owner, executionID))
	if err == nil {
		err = envelope.CheckVersion(env.V)
	}
	if err != nil {
		return nil, err
	}
	return env, nil
}

// loadEnded reads the envelope of an execution the workers say ended, again
// while the replica that answers has not applied it, until ctx ends.
func (c *Client) loadEnded(ctx context.Context, owner, executionID string) (*envelope.Envelope, error) {
	for try := 0; ; try++ {
		env, err := c.loadEnvelope(ctx, owner, executionID)
		if !errors.Is(err, broker.ErrNotFound) {
			return env, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("capstan: the envelope of %s, which the workers read, is on no replica this client reads: %w", executionID, ctx.Err())
		case <-time.After(broker.Backoff(try)):
		}
	}
}

func noSuchExecution(id string) error {
	return fmt.Errorf("%w: %s: neither its request, nor its record, nor its envelope is stored", ErrNoSuchExecution, id)
}

// youngFor is how long until an execution id is probeAfter old: 0 for an id
// older, or one that does not say (not a UUIDv7); at most probeAfter (an id
// made in this clock's future).
func youngFor(id string) time.Duration {
	made, ok := envelope.ExecutionIDTime(id)
	if !ok {
		return 0
	}
	return min(max(probeAfter-time.Since(made), 0), probeAfter)
}

// awaitAsking waits for the envelope of a young id, asking the workers after
// wait whether anything of it is stored, and again every probeAfter while
// they give no answer: a request that never arrives ends the wait with
// ErrNoSuchExecution then, not at ctx's end. Once they say it exists, the
// wait goes on as any other.
func (c *Client) awaitAsking(ctx context.Context, id string, ch chan *envelope.Envelope, wait time.Duration) (*envelope.Envelope, error) {
	errGone := noSuchExecution(id)
	errEnded := errors.New("ended: its envelope is read")
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		t := time.NewTimer(wait)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-actx.Done():
				return
			case <-t.C:
			}
			switch state, answered := c.probeState(actx, id); {
			case answered && state == ExecUnknown:
				cancel(errGone)
				return
			case answered && state == ExecEnded:
				cancel(errEnded) // stored before the waiter, or where this client's replica has not applied it
				return
			case answered && state != ExecUncertain:
				return // it exists: its envelope is waited for
			}
			t.Reset(probeAfter)
		}
	}()
	env, err := c.w.AwaitFresh(actx, id, ch, c.w.Reconnects())
	if err != nil && ctx.Err() == nil {
		switch cause := context.Cause(actx); {
		case errors.Is(cause, errGone):
			return nil, errGone
		case errors.Is(cause, errEnded):
			return c.loadEnded(ctx, c.principal, id)
		}
	}
	return env, err
}

// probeWait bounds how long Await asks the workers whether an execution
// it found no envelope for exists at all.
const probeWait = 2 * time.Second

// probeAfter: an id younger than this is not probed.
const probeAfter = 2 * time.Second

// absenceNeedsWorkers reports whether what this client's reads find absent
// may yet exist, and only the workers can tell: its reads may lag, and it
// asks no leader (a principal's, on a cluster: DESIGN §12).
func (c *Client) absenceNeedsWorkers() bool {
	return c.b.Replicas == 0 && c.b.ReadsMayLag()
}

// probeState asks the workers (or, on an open server with none, the client
// itself) where the client's execution is: ExecUnknown when nothing of it is
// stored (no request waiting in its queue, no record, no envelope, read in
// that order, which no claim racing the reads can hide it from); answered is
// false when nothing answered within probeWait (no worker, an older one).
// A client whose reads may lag and that asks no leader (a principal's, on
// a cluster: DESIGN §12) asks for the execution itself rather than where it
// is, which says ExecEnded whenever the workers read its envelope.
func (c *Client) probeState(ctx context.Context, executionID string) (state string, answered bool) {
	pctx, cancel := context.WithTimeout(ctx, probeWait)
	defer cancel()
	req := ExecutionRequest{ExecutionID: executionID, Owner: c.principal, Probe: !c.absenceNeedsWorkers()}
	v, err := c.Execution(pctx, req)
	if errors.Is(err, ErrNoSuchExecution) && !req.Probe {
		return ExecUnknown, true
	}
	if err != nil {
		return "", false
	}
	return v.State, true
}

// ErrExpired marks an execution whose envelope is no longer kept: it will
// never be answered. See ExpiredError.
var ErrExpired = errors.New("capstan: execution expired")

// ExpiredError is an execution whose envelope expired. It is decided only for
// an id that is a UUIDv7 (what the client makes by default), whose time says
// how old the execution is: an id made longer ago than the envelopes bucket
// keeps envelopes (read from the bucket, Deployment.EnvelopeRetention),
// with no envelope and no record of an execution in flight, is expired. Its
// envelope, made after its id, was kept at least that long and is gone; no
// request is started later than its start window, which the client keeps
// below the retention. Another id says nothing of its age: awaiting it waits.
// errors.Is(err, ErrExpired) holds, and errors.Is(err, ErrNoSuchExecution)
// too when no record of it is left either.
type ExpiredError struct {
	// ExecutionID is the execution's.
	ExecutionID string
	// MadeAt is the time in the id: when its client made it.
	MadeAt time.Time
	// Retention is how long the envelopes bucket keeps an envelope.
	Retention time.Duration
	// State is the state its record still says, when the record outlived
	// the envelope; empty when no record is left. A record is not rewritten
	// after its envelope, so only a finalized one (a refusal before the
	// claim, NOT_STARTED) tells the outcome: Status and Code.
	State  execution.State
	Status envelope.Status // the finalized record's envelope status; empty otherwise
	Code   envelope.Code   // the finalized record's error code; empty otherwise
}

// Error says when the id was made and how long envelopes are kept.
func (e *ExpiredError) Error() string {
	msg := fmt.Sprintf("capstan: execution %s expired: its id was made %s, %s ago, and envelopes are kept %s",
		e.ExecutionID, e.MadeAt.Format(time.RFC3339), time.Since(e.MadeAt).Round(time.Second), e.Retention)
	switch {
	case e.Status != "":
		msg += fmt.Sprintf("; its record says %s", e.Status)
		if e.Code != "" {
			msg += " " + string(e.Code)
		}
	case e.State != "":
		msg += fmt.Sprintf("; its record says %s, and the trail (capstan audit) holds its outcome", e.State)
	}
	return msg
}

// Unwrap makes the error ErrExpired, and ErrNoSuchExecution when no record
// is left.
func (e *ExpiredError) Unwrap() []error {
	if e.State == "" {
		return []error{ErrExpired, ErrNoSuchExecution}
	}
	return []error{ErrExpired}
}

// expired decides, for an execution of owner's whose envelope was not found,
// whether it expired: nil when it did not or cannot be told.
func (c *Client) expired(ctx context.Context, owner, executionID string) *ExpiredError {
	made, ok := envelope.ExecutionIDTime(executionID)
	if !ok {
		return nil
	}
	if time.Since(made) < min(c.maxStart, time.Minute) {
		return nil // younger than any retention in use: no read needed
	}
	retention, err := c.envelopeRetention(ctx) // now: an operator may have changed it
	if err != nil {
		c.cfg.Logger.Warn("envelope retention unreadable: cannot tell whether the execution expired",
			"executionId", executionID, "err", err)
		return nil
	}
	if time.Since(made) < retention {
		return nil
	}
	rctx, cancel := context.WithTimeout(ctx, await.PublishTry)
	defer cancel()
	rec, _, err := broker.LoadCurrent[execution.Record](rctx, c.b, c.b.Executions, broker.Key(owner, executionID))
	switch {
	case errors.Is(err, broker.ErrNotFound):
		return &ExpiredError{ExecutionID: executionID, MadeAt: made, Retention: retention}
	case err != nil, rec.InFlight(time.Now()):
		return nil // unknown, or still in flight: its envelope is to come
	}
	// Ended, or abandoned: its envelope, if it had one, is gone, unless it
	// was stored since the first read.
	if _, err := c.loadEnvelope(rctx, owner, executionID); !errors.Is(err, broker.ErrNotFound) {
		return nil
	}
	xerr := &ExpiredError{ExecutionID: executionID, MadeAt: made, Retention: retention, State: rec.State}
	if rec.State == execution.StateFinalized {
		xerr.Status, xerr.Code = rec.Status, rec.LastError
	}
	return xerr
}

// publish stores m, publishing again through a failover.
func (c *Client) publish(ctx context.Context, m *nats.Msg) error {
	_, err := await.Publish(ctx, c.b.NC, m, c.cfg.Logger)
	return err
}

// Call submits and awaits. err reports transport trouble only; governed
// outcomes (completed, failed, cancelled, approval-required) are in the
// envelope. Under a context of WithProgress, the execution's progress goes
// to its callback while the call waits. An id that can never name a capability is refused here, as a
// failed CAPABILITY_NOT_FOUND envelope that was never published; a request
// the principal's full queue refused, as a failed QUOTA_EXCEEDED envelope
// that was never stored (DESIGN §12 "Quotas").
func (c *Client) Call(ctx context.Context, capabilityID string, input any, opts ...CallOption) (*envelope.Envelope, error) {
	envs, errs := c.CallMany(ctx, []Request{{CapabilityID: capabilityID, Input: input, Options: opts}})
	return envs[0], errs[0]
}

// Request is one call of a fan-out.
type Request struct {
	// CapabilityID, Input and Options are Call's arguments.
	CapabilityID string
	Input        any          // as for Call: nil, an envelope.Raw, a json.RawMessage or a value to encode
	Options      []CallOption // options of this request alone
}

// CallMany submits every request at once and awaits every envelope. The
// results are in the order of reqs; errs[i] is set only for transport trouble
// of reqs[i].
func (c *Client) CallMany(ctx context.Context, reqs []Request) ([]*envelope.Envelope, []error) {
	var envs []*envelope.Envelope
	var errs []error
	var calls []*await.Call
	var ends []func(*envelope.Envelope, error)
	if len(reqs) == 1 {
		// A call on its own (Call): its results in one allocation.
		one := new(struct {
			envs  [1]*envelope.Envelope
			errs  [1]error
			calls [1]*await.Call
			ends  [1]func(*envelope.Envelope, error)
		})
		envs, errs, calls, ends = one.envs[:], one.errs[:], one.calls[:], one.ends[:]
	} else {
		envs = make([]*envelope.Envelope, len(reqs))
		errs = make([]error, len(reqs))
		calls = make([]*await.Call, len(reqs))
		ends = make([]func(*envelope.Envelope, error), len(reqs))
	}
	defer func() {
		for i, end := range ends {
			if end != nil {
				end(envs[i], errs[i])
			}
		}
	}()
	if err := c.closed(); err != nil {
		for i := range errs {
			errs[i] = err
		}
		return envs, errs
	}
	reconnects := c.w.Reconnects()
	progress := c.progressFor(ctx, len(reqs)) // nil unless WithProgress asked
	defer progress.stop()
	for i, rq := range reqs {
		r, own, err := c.newRequest(rq.CapabilityID, rq.Input, rq.Options)
		if err != nil {
			var ce *envelope.CapabilityError
			if errors.As(err, &ce) {
				envs[i] = refused(rq.CapabilityID, r, ce)
			} else {
				errs[i] = err
			}
			continue
		}
		progress.follow(r.ExecutionID)
		ends[i] = c.cfg.Observer.Call(ctx, r)
		m, unserved, err := c.message(ctx, r)
		if err != nil {
			errs[i] = err
			continue
		}
		if unserved != nil && c.cfg.Unserved != UnservedWait {
			envs[i], errs[i] = c.unserved(ctx, m, unserved, own)
			continue
		}
		if len(reqs) == 1 {
			calls[i] = c.w.SendSync(ctx, r.ExecutionID, m, own)
			continue
		}
		calls[i] = c.w.Send(r.ExecutionID, m, own)
	}
	c.w.Settle(ctx, calls)
	var quota *envelope.CapabilityError // the first refusal's, for the others
	for i, call := range calls {
		if call == nil {
			continue
		}
		envs[i], errs[i] = c.w.Wait(ctx, call, reconnects)
		if full := broker.AsQueueFull(errs[i]); full != nil {
			// Refused at the door: an envelope that was never stored, as
			// for a capability id that can never be one.
			if quota == nil || quota.Details["quota"] != full.Quota {
				quota = c.quotaError(ctx, full)
			}
			envs[i], errs[i] = refused(reqs[i].CapabilityID, &envelope.Request{ExecutionID: call.ID()}, quota), nil
		}
	}
	return envs, errs
}

// unserved answers a call no live worker serves at once: stored (queued),
// or, refused, not. A caller's own id may name an execution that ended
// already: its envelope is the answer then.
func (c *Client) unserved(ctx context.Context, m *nats.Msg, u *UnservedError, own bool) (*envelope.Envelope, error) {
	if c.cfg.Unserved == UnservedRefuse {
		return nil, u
	}
	if err := c.publish(ctx, m); err != nil {
		return nil, fmt.Errorf("capstan: submit %s: %w", u.ExecutionID, err)
	}
	if !own {
		if env, err := c.w.Load(ctx, u.ExecutionID); err == nil {
			return env, nil
		}
	}
	u.Queued = true
	return nil, u
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

// ExecutionStatus is what the runtime knows of one execution: its record
// and, once it ended, its envelope (whose Status, an envelope.Status, is the
// outcome).
type ExecutionStatus struct {
	// Record is the execution's record; nil once it went (a record window
	// after the envelope).
	Record *execution.Record `json:"record,omitempty"`
	// Envelope is the outcome; nil while the execution runs.
	Envelope *envelope.Envelope `json:"envelope,omitempty"`
}

// Status reads the execution record and the envelope. An execution no
// worker has taken yet has neither, and is ErrNoSuchExecution as an id never
// submitted is. On a cluster a producer reads through whichever replica
// answers; when that finds nothing, Status asks the workers (a control
// request, counted against the principal's quota), so that a replica behind
// never makes an accepted execution unknown.
func (c *Client) Status(ctx context.Context, executionID string) (*ExecutionStatus, error) {
	return c.StatusOf(ctx, c.principal, executionID)
}

// StatusOf reads another principal's execution: what an admin's credentials
// allow (a producer's server refuses the read, which then fails or times out).
func (c *Client) StatusOf(ctx context.Context, owner, executionID string) (*ExecutionStatus, error) {
	if err := envelope.ValidExecutionID(executionID); err != nil {
		return nil, fmt.Errorf("capstan: %w", err)
	}
	if !broker.ValidPrincipal(owner) {
		return nil, fmt.Errorf("capstan: owner %q is not a principal", owner)
	}
	key := broker.Key(owner, executionID)
	rec, err := loadReadable(ctx, c.b, c.b.Executions, key, func(r *execution.Record) int { return r.V })
	if err != nil {
		return nil, err
	}
	env, err := loadReadable(ctx, c.b, c.b.Envelopes, key, func(e *envelope.Envelope) int { return e.V })
	if err != nil {
		return nil, err
	}
	if rec == nil && env == nil && c.absenceNeedsWorkers() && !execrpc.AbsenceTakenAsQueued(ctx) {
		if rec, env, err = c.askedOf(ctx, owner, executionID); err != nil {
			return nil, err
		}
	}
	s := ExecutionStatus{Record: rec, Envelope: env}
	if rec != nil && env != nil && rec.State != execution.StateFinalized {
		// The envelope is the proof of the end: a worker does not rewrite
		// the record after it (DESIGN §14). Show the record as it stands
		// for what the envelope says.
		r := *rec
		r.State, r.Status, r.Attempt = execution.StateFinalized, env.Status, env.Attempts
		s.Record = &r
	}
	if s.Record == nil && s.Envelope == nil {
		if xerr := c.expired(ctx, owner, executionID); xerr != nil {
			return nil, xerr
		}
		return nil, fmt.Errorf("%w: %s", ErrNoSuchExecution, executionID)
	}
	return &s, nil
}

// askedOf is what the workers hold of owner's execution id, for a client
// whose reads found nothing of it: a principal's connection reads through
// whichever replica answers and may not ask a stream's leader (DESIGN §12),
// while the workers do. Nothing when they hold nothing, or when no worker
// runs (no one can tell better than the client's replica); an error when
// they did not answer.
func (c *Client) askedOf(ctx context.Context, owner, executionID string) (*execution.Record, *envelope.Envelope, error) {
	v, err := c.Execution(ctx, ExecutionRequest{ExecutionID: executionID, Owner: owner})
	for try := 0; try < maxQuotaWaits; try++ {
		// A principal reading fast meets its control quota here first:
		// the workers say when to ask again.
		wait, ok := quotaWait(err)
		if !ok {
			break
		}
		select {
		case <-ctx.Done():
			return nil, nil, fmt.Errorf("capstan: status of %s: %w", executionID, err)
		case <-time.After(wait):
		}
		v, err = c.Execution(ctx, ExecutionRequest{ExecutionID: executionID, Owner: owner})
	}
	switch {
	case errors.Is(err, ErrNoSuchExecution), errors.Is(err, ErrNoWorkers):
		return nil, nil, nil
	case err != nil:
		return nil, nil, fmt.Errorf("capstan: %s is on no replica this client reads, and the workers did not say whether it exists: %w", executionID, err)
	case v.Record != nil && envelope.CheckVersion(v.Record.V) != nil:
		return nil, nil, envelope.CheckVersion(v.Record.V)
	case v.Envelope != nil && envelope.CheckVersion(v.Envelope.V) != nil:
		return nil, nil, envelope.CheckVersion(v.Envelope.V)
	}
	env := v.Envelope
	if env != nil && len(v.Omitted) > 0 {
		// Cut to fit the reply: the whole is read again, once the replica
		// that answers holds it.
		ectx, cancel := context.WithTimeout(ctx, probeWait)
		defer cancel()
		if whole, err := c.loadEnded(ectx, owner, executionID); err == nil {
			env = whole
		}
	}
	return v.Record, env, nil
}

// maxQuotaWaits bounds how often askedOf waits out its principal's control
// quota.
const maxQuotaWaits = 20

// quotaWait is how long a quota's refusal says to wait before asking again;
// ok is false for any other error, and a refusal that says no wait helps.
func quotaWait(err error) (wait time.Duration, ok bool) {
	var ce *envelope.CapabilityError
	if !errors.As(err, &ce) || ce.Code != envelope.CodeQuotaExceeded {
		return 0, false
	}
	// A number of any width: the reply's decoding chooses it.
	switch ms := reflect.ValueOf(ce.Details["retryAfterMs"]); {
	case ms.CanInt():
		return time.Duration(ms.Int()) * time.Millisecond, true
	case ms.CanUint():
		return time.Duration(ms.Uint()) * time.Millisecond, true
	case ms.CanFloat():
		return time.Duration(ms.Float() * float64(time.Millisecond)), true
	}
	return 0, false
}

// loadReadable loads key's value, nil when there is none, and refuses one
// of a version this build cannot read.
func loadReadable[T any](ctx context.Context, b *broker.Broker, kv jetstream.KeyValue, key string, version func(*T) int) (*T, error) {
	v, _, err := broker.LoadCurrent[T](ctx, b, kv, key)
	if err == nil {
		err = envelope.CheckVersion(version(v))
	}
	if err != nil && !errors.Is(err, broker.ErrNotFound) {
		return nil, err
	}
	return v, nil
}

// ErrNoWorkers: no worker answered a request only workers serve.
var ErrNoWorkers = execrpc.ErrNoWorkers

// CancelOption changes a cancel request.
type CancelOption func(*CancelRequest)

// OwnedBy cancels another principal's execution: only an admin's is honoured.
func OwnedBy(principal string) CancelOption { return func(r *CancelRequest) { r.Owner = principal } }

// Cancel asks the workers to cancel one of the client's executions (another
// principal's, for an admin, with OwnedBy). Cancelling is terminal at any
// point: before a claim, during an attempt, during a backoff (a read without
// a claim still queued is stopped only by a worker that heard of the cancel:
// see Meta.Idempotent). An execution
// that ended is not changed: the reply says Finalized and its Status, for as
// long as its envelope is kept. An id of which nothing is stored (no request
// in its queue, no record, no envelope) fails with ErrNoSuchExecution, and
// nothing is recorded.
func (c *Client) Cancel(ctx context.Context, executionID string, opts ...CancelOption) (*CancelReply, error) {
	if err := envelope.ValidExecutionID(executionID); err != nil {
		return nil, fmt.Errorf("capstan: %w", err)
	}
	var req CancelRequest
	for _, o := range opts {
		o(&req)
	}
	var body []byte
	if len(opts) > 0 {
		body, _ = json.Marshal(req)
	}
	data, err := execrpc.Request(ctx, c.b.NC, c.b.Names.CancelSubject(c.principal, executionID), body, 10*time.Second,
		"cancel "+executionID)
	if err != nil {
		return nil, err
	}
	var r CancelReply
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("capstan: cancel %s: bad reply: %w", executionID, err)
	}
	if slices.Contains(r.Conditions, "unknown") {
		if xerr := c.expired(ctx, cmp.Or(req.Owner, c.principal), executionID); xerr != nil {
			return nil, xerr
		}
		return nil, fmt.Errorf("%w: %s: nothing of it is stored; nothing was recorded", ErrNoSuchExecution, executionID)
	}
	if r.Error != "" {
		if slices.Contains(r.Conditions, "quota_exceeded") {
			return &r, envelope.QuotaRefusal(r.Error, r.Details)
		}
		return &r, fmt.Errorf("capstan: cancel %s: %s", executionID, r.Error)
	}
	return &r, nil
}
