package engine

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/broker"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/limits"
	"github.com/capstan-dev/capstan/observe"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Config is what the machinery needs of a worker's configuration, defaults
// applied.
type Config struct {
	// ID names the worker in records, envelopes and audit.
	ID string
	// Lease is how long a claim holds without renewal.
	Lease time.Duration
	// RolloutDelay is the longest a request for a capability this worker
	// lacks, but the catalog lists, waits before it is delivered again: the
	// first redelivery comes sooner (rolloutDelay).
	RolloutDelay time.Duration
	// StrictAudit requires capability.started to be stored before a handler runs.
	StrictAudit bool
	// DisableLeaseRenewal stops lease renewal and InProgress (tests of redelivery).
	DisableLeaseRenewal bool
	// Capabilities are the capabilities this worker serves, by id.
	Capabilities map[string]Definition
	// Listed reports whether the catalog lists a capability (some pool
	// serves it, or its pool is down) as the catalog bucket holds it now, not
	// as a copy that may lag it: a request is ended CAPABILITY_NOT_FOUND on
	// its answer. An error: the bucket did not answer.
	Listed func(id string) (bool, error)
	// ResolveResume fills a resume that names only its approval (a producer
	// that may not read approvals sends those): capability, input, actor and
	// surface come from the approval, which must be principal's. An error is
	// the request's refusal when it is an *envelope.CapabilityError; any other
	// error leaves the request for a later delivery.
	ResolveResume func(ctx context.Context, principal string, req *envelope.Request) error
	// Pool names the worker's pool, for the observer.
	Pool string
	// Observer is told what happens to each delivery (never nil).
	Observer observe.Worker
	// Now is the engine's clock (default time.Now): every rule that reads
	// the time reads it here.
	Now func() time.Time
}

// Stats counts what a runner did.
type Stats struct {
	Handled, HandlerCalls, Finalized, Conflicts, Abandoned, TakenOver, Duplicates uint64
	// NotStarted counts requests this worker ended NOT_STARTED.
	NotStarted uint64
	// Limited counts executions a limit held back: waited, refused or sent
	// to an approval (DESIGN §17).
	Limited uint64
	// Deferred counts deliveries left for later because their principal
	// held its fair share of the slots while others were active.
	Deferred uint64
	// Recovered counts executions this worker finalized completed from a
	// lost attempt's receipt or its reconciler's finding (DESIGN §5).
	Recovered uint64
}

// Runner is the delivery machinery of one worker: its intake pulls
// deliveries and carries each through the engine in a pass of its own
// (delivery.go); the control requests (a cancel) and the sweeper's ends
// come in here too.
type Runner struct {
	w  *worker
	in intake
	// serving is closed once Serve pulls from its consumers (Serving).
	serving     chan struct{}
	servingOnce sync.Once
}

// worker is what the deliveries of one worker share: its configuration,
// clock and log, the store of records and envelopes, the trail, the limits,
// the fair share, the table of executions in flight and the counters. Its
// parts call no delivery back.
type worker struct {
	nc    *nats.Conn
	b     *broker.Broker
	audit *audit.Emitter
	cfg   Config
	log   *slog.Logger
	now   func() time.Time
	// store holds the executions' records and envelopes.
	store *store
	// limits holds the counters of capabilities' limits (DESIGN §17).
	limits *limits.Store
	// ids makes the message ids of the requests it forwards.
	ids broker.MsgIDs

	// base outlives the Serve context: in-flight executions keep running
	// through a graceful shutdown until the grace period ends.
	base       context.Context
	baseCancel context.CancelCauseFunc

	inflight inflight
	stats    stats
	// share is the fair share of the pool's slots between principals, set
	// by Serve.
	share atomic.Pointer[fairShare]
	// retention is the envelope retention (nanoseconds) as last read: at
	// the start, then by ReadEnvelopeRetention and before every refusal of
	// a request for its id's age (a server may change it while workers run).
	retention atomic.Int64
}

// NewRunner returns the machinery of one worker. Its context ends with Stop.
func NewRunner(nc *nats.Conn, log *slog.Logger, cfg Config) *Runner {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	w := &worker{nc: nc, cfg: cfg, log: log, now: cfg.Now, inflight: inflight{m: make(map[string]context.CancelCauseFunc)}}
	if nc != nil { // a runner of no connection (benchmarks of the stages) forwards nothing
		var err error
		if w.ids, err = broker.NewMsgIDs(nc); err != nil {
			// The connection signed its own authentication; a key that
			// cannot sign now leaves forwards' message ids without a tag.
			log.Warn("message ids of forwarded requests carry no tag", "err", err)
		}
	}
	w.base, w.baseCancel = context.WithCancelCause(context.Background())
	return &Runner{w: w, in: intake{log: log}, serving: make(chan struct{})}
}

// Provisioned gives the runner the resources its worker provisioned and the
// worker's audit emitter, before it serves anything.
func (r *Runner) Provisioned(b *broker.Broker, em *audit.Emitter) {
	w := r.w
	w.b, w.audit = b, em
	w.store = &store{b: b, nc: w.nc, log: w.log, lease: w.cfg.Lease, now: w.now, shutdown: w.base}
	if b.Limits != nil {
		w.limits = limits.NewStore(b, w.holderAlive, w.now)
	}
	w.retention.Store(int64(b.Config.EnvelopeRetention))
}

// ReadEnvelopeRetention reads the envelope retention again where
// provisioning records it, and returns it: a server started with another
// retention changes it while workers run. When it cannot be read, the value
// known is kept and returned.
func (r *Runner) ReadEnvelopeRetention(ctx context.Context) time.Duration {
	return r.w.readEnvelopeRetention(ctx)
}

// Context ends when the worker shuts down (Stop).
func (r *Runner) Context() context.Context { return r.w.base }

// Serving is closed once Serve pulls from the pool's consumer and the
// unrouted one; never, if Serve is never called or fails to start pulling.
func (r *Runner) Serving() <-chan struct{} { return r.serving }

// Stop ends every execution still running: the worker shut down.
func (r *Runner) Stop() { r.w.baseCancel(errShutdown) }

// Stats returns the runner's counters.
func (r *Runner) Stats() Stats { return r.w.stats.snapshot() }

// Serve pulls deliveries from the pool's consumer (up to concurrency at once)
// and from the unrouted one, and handles each, until ctx ends. Then it stops
// fetching, lets in-flight executions finish within grace, and abandons the
// rest to a takeover.
func (r *Runner) Serve(ctx context.Context, pool, unrouted jetstream.Consumer, concurrency int, grace time.Duration) error {
	w := r.w
	if Reserve(concurrency) > 0 {
		// With nothing to keep back (one slot) a share never refuses:
		// deliveries skip it.
		w.share.Store(newFairShare(concurrency))
	}
	counted := func(handle func(jetstream.Msg)) func(jetstream.Msg) {
		return func(msg jetstream.Msg) {
			w.stats.handled.Add(1)
			handle(msg)
		}
	}
	if err := r.in.pull(pool, concurrency, counted(r.handle)); err != nil {
		return err
	}
	if err := r.in.pull(unrouted, 4, counted(r.handleUnrouted)); err != nil {
		r.in.stop()
		return err
	}
	r.servingOnce.Do(func() { close(r.serving) })

	<-ctx.Done()
	w.log.Info("worker draining", "grace", grace)
	r.in.drain(grace, func() {
		w.log.Warn("grace period over: abandoning in-flight executions to a takeover", "inflight", w.inflight.len())
		w.baseCancel(errShutdown)
	})
	w.baseCancel(errShutdown)
	return nil
}

// handle carries one delivery of the pool's consumer through the engine.
func (r *Runner) handle(msg jetstream.Msg) { arrive(r.w, msg, false).pass() }

// handleUnrouted carries one delivery of the _unrouted consumer (requests a
// producer sent there because its catalog did not list the capability)
// through the engine.
func (r *Runner) handleUnrouted(msg jetstream.Msg) { arrive(r.w, msg, true).pass() }

// CancelLocal stops this worker's run of principal's execution at once, if
// it has one and its record says the caller cancelled it. A notice alone
// proves nothing: the server also publishes on a notice's subject when a
// producer names it as the reply of a request it may make, so the record,
// which only workers write, decides. It is read from the stream's leader,
// which stored the cancel before the notice was sent.
func (r *Runner) CancelLocal(principal, executionID string) {
	key := broker.Key(principal, executionID)
	cancel := r.w.inflight.get(key)
	if cancel == nil {
		return
	}
	ctx, done := StoreContext()
	rec, _, err := broker.LoadFromLeader[Record](ctx, r.w.nc, r.w.b.Executions, key)
	done()
	if err != nil || !rec.CancelRequested || rec.ExecutionID != executionID {
		// Not recorded (or not readable): the lease renewal reads the record
		// again and stops the run if a cancel is recorded by then.
		return
	}
	cancel(errCallerCancelled)
}

// envelopeRetention is how long envelopes are kept, as last read (0: for
// ever).
func (w *worker) envelopeRetention() time.Duration { return time.Duration(w.retention.Load()) }

// readEnvelopeRetention reads the envelope retention again
// (Runner.ReadEnvelopeRetention).
func (w *worker) readEnvelopeRetention(ctx context.Context) time.Duration {
	if kept, err := w.b.EnvelopeRetention(ctx); err == nil {
		w.retention.Store(int64(kept))
	}
	return w.envelopeRetention()
}

// windows are the durations the rules read (DESIGN §13, §16). An id is
// recent for the short path within the record window, or less when
// envelopes are kept for less.
func (w *worker) windows() Windows {
	win := Windows{Record: w.b.Config.RecordWindow, Recent: w.b.Config.RecordWindow, TTL: w.b.Config.RecordTTL}
	if kept := w.envelopeRetention(); kept > 0 {
		win.Recent = min(win.Recent, broker.MaxStartWithin(kept))
	}
	return win
}

// olderThanRetention reports whether an id made at made is older than any
// envelope of it is kept (less the margin, broker.MaxStartWithin). It reads
// the retention again before it says so: a refusal by a retention grown
// since would end a request its caller still waits for without an envelope.
func (w *worker) olderThanRetention(made time.Time) bool {
	old := func(kept time.Duration) bool { return kept > 0 && w.now().Sub(made) > broker.MaxStartWithin(kept) }
	if !old(w.envelopeRetention()) {
		return false
	}
	ctx, cancel := StoreContext()
	defer cancel()
	return old(w.readEnvelopeRetention(ctx))
}

// principalOf is the principal a delivery's subject names (an open server's
// requests are the anonymous principal's).
func (w *worker) principalOf(msg jetstream.Msg) string {
	principal, _, _ := w.b.Names.ParseExecSubject(msg.Subject())
	if principal == "" {
		principal = broker.Anonymous
	}
	return principal
}

// observed is what the observer is told of a delivery d of req.
func (w *worker) observed(d Delivery, req *envelope.Request, known bool) observe.Delivery {
	return observe.Delivery{Request: req, Pool: w.cfg.Pool, Worker: w.cfg.ID, Known: known, Deliveries: d.Deliveries,
		Stored: d.Stored}
}

// emit files ev, which belongs to no execution's trail, at once.
func (w *worker) emit(ev *audit.Event) {
	ev.Worker = w.cfg.ID
	w.audit.Emit(ev)
}

// stats counts what a runner's deliveries did, each counter where it
// happens.
type stats struct {
	handled, handlerCalls, finalized, conflicts  atomic.Uint64
	abandoned, takenOver, duplicates, notStarted atomic.Uint64
	recovered                                    atomic.Uint64
	// limited counts executions a limit held back (DESIGN §17).
	limited atomic.Uint64
	// deferred counts the deliveries the fair share left for later.
	deferred atomic.Uint64
}

// snapshot is the counters now.
func (s *stats) snapshot() Stats {
	return Stats{
		Handled: s.handled.Load(), HandlerCalls: s.handlerCalls.Load(), Finalized: s.finalized.Load(),
		Conflicts: s.conflicts.Load(), Abandoned: s.abandoned.Load(), TakenOver: s.takenOver.Load(),
		Duplicates: s.duplicates.Load(), NotStarted: s.notStarted.Load(), Recovered: s.recovered.Load(),
		Limited: s.limited.Load(), Deferred: s.deferred.Load(),
	}
}

// inflight is the table of the executions this worker runs, by key, each
// with the end of its context: a redelivery of one of them is left to it,
// and a caller's cancel reaches it at once (Runner.CancelLocal).
type inflight struct {
	mu sync.Mutex
	m  map[string]context.CancelCauseFunc
}

// add enters key, unless an execution of it is in flight here already.
// Only a delivery whose add succeeded removes key.
func (t *inflight) add(key string, cancel context.CancelCauseFunc) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, busy := t.m[key]; busy {
		return false
	}
	t.m[key] = cancel
	return true
}

// remove ends key's entry.
func (t *inflight) remove(key string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.m, key)
}

// get is the end of the context of key's execution in flight here, nil for
// none.
func (t *inflight) get(key string) context.CancelCauseFunc {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.m[key]
}

// len is how many executions are in flight.
func (t *inflight) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.m)
}

// nak asks for a redelivery after delay; a bare NAK would burn deliveries.
func nak(msg jetstream.Msg, delay time.Duration) {
	if delay < 100*time.Millisecond {
		delay = 100 * time.Millisecond
	}
	_ = msg.NakWithDelay(delay)
}

func ackSync(msg jetstream.Msg) {
	for i := 0; i < 3; i++ {
		if err := msg.DoubleAck(context.Background()); err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	// A lost ack only means a redelivery, which finds the envelope and acks.
}
