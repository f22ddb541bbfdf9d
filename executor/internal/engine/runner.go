package engine

import (
	"context"
	"errors"
	"fmt"
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
	// NearName is the capability the caller may see (the principal's grant,
	// the request's surface and actor) whose id is nearest the one a
	// request named, when one is near enough to be what was meant; "" when
	// none is (or nil). A CAPABILITY_NOT_FOUND suggests it.
	NearName func(principal string, req *envelope.Request) string
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

// Runner is the delivery machinery of one worker: it pulls deliveries, and
// claims, runs and finalizes each.
type Runner struct {
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

	mu       sync.Mutex
	inflight map[string]*Execution
	// pulling names the queues Serve pulls from.
	pulling map[string]bool

	// base outlives the Serve context: in-flight executions keep running
	// through a graceful shutdown until the grace period ends.
	base       context.Context
	baseCancel context.CancelCauseFunc

	handled, handlerCalls, finalized, conflicts atomic.Uint64
	abandoned, takenOver, duplicates            atomic.Uint64
	notStarted                                  atomic.Uint64
	recovered                                   atomic.Uint64
	// limited counts executions a limit held back (DESIGN §17).
	limited atomic.Uint64
	// share is the fair share of the pool's slots between principals, set
	// by Serve; deferred counts the deliveries it left for later.
	share    atomic.Pointer[fairShare]
	deferred atomic.Uint64

	// serving is closed once Serve pulls from its consumers (Serving).
	serving     chan struct{}
	servingOnce sync.Once

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
	r := &Runner{nc: nc, cfg: cfg, log: log, now: cfg.Now, inflight: make(map[string]*Execution),
		pulling: map[string]bool{}, serving: make(chan struct{})}
	if nc != nil { // a runner of no connection (benchmarks of the stages) forwards nothing
		var err error
		if r.ids, err = broker.NewMsgIDs(nc); err != nil {
			// The connection signed its own authentication; a key that
			// cannot sign now leaves forwards' message ids without a tag.
			log.Warn("message ids of forwarded requests carry no tag", "err", err)
		}
	}
	r.base, r.baseCancel = context.WithCancelCause(context.Background())
	return r
}

// Provisioned gives the runner the resources its worker provisioned and the
// worker's audit emitter, before it serves anything.
func (r *Runner) Provisioned(b *broker.Broker, em *audit.Emitter) {
	r.b, r.audit = b, em
	r.store = &store{b: b, nc: r.nc, log: r.log, lease: r.cfg.Lease, now: r.now, shutdown: r.base}
	if b.Limits != nil {
		r.limits = limits.NewStore(b, r.holderAlive, r.now)
	}
	r.retention.Store(int64(b.Config.EnvelopeRetention))
}

// envelopeRetention is how long envelopes are kept, as last read (0: for
// ever).
func (r *Runner) envelopeRetention() time.Duration { return time.Duration(r.retention.Load()) }

// ReadEnvelopeRetention reads the envelope retention again where
// provisioning records it, and returns it: a server started with another
// retention changes it while workers run. When it cannot be read, the value
// known is kept and returned.
func (r *Runner) ReadEnvelopeRetention(ctx context.Context) time.Duration {
	if kept, err := r.b.EnvelopeRetention(ctx); err == nil {
		r.retention.Store(int64(kept))
	}
	return r.envelopeRetention()
}

// windows are the durations the rules read (DESIGN §13, §16). An id is
// recent for the short path within the record window, or less when
// envelopes are kept for less.
func (r *Runner) windows() Windows {
	w := Windows{Record: r.b.Config.RecordWindow, Recent: r.b.Config.RecordWindow, TTL: r.b.Config.RecordTTL}
	if kept := r.envelopeRetention(); kept > 0 {
		w.Recent = min(w.Recent, broker.MaxStartWithin(kept))
	}
	return w
}

// olderThanRetention reports whether an id made at made is older than any
// envelope of it is kept (less the margin, broker.MaxStartWithin). It reads
// the retention again before it says so: a refusal by a retention grown
// since would end a request its caller still waits for without an envelope.
func (r *Runner) olderThanRetention(made time.Time) bool {
	old := func(kept time.Duration) bool { return kept > 0 && r.now().Sub(made) > broker.MaxStartWithin(kept) }
	if !old(r.envelopeRetention()) {
		return false
	}
	ctx, cancel := StoreContext()
	defer cancel()
	return old(r.ReadEnvelopeRetention(ctx))
}

// Context ends when the worker shuts down (Stop).
func (r *Runner) Context() context.Context { return r.base }

// Serving is closed once Serve pulls from the first queues it was given;
// never, if Serve is never called or fails to start pulling.
func (r *Runner) Serving() <-chan struct{} { return r.serving }

// Stop ends every execution still running: the worker shut down.
func (r *Runner) Stop() { r.baseCancel(errShutdown) }

// Stats returns the runner's counters.
func (r *Runner) Stats() Stats {
	return Stats{
		Handled: r.handled.Load(), HandlerCalls: r.handlerCalls.Load(), Finalized: r.finalized.Load(),
		Conflicts: r.conflicts.Load(), Abandoned: r.abandoned.Load(), TakenOver: r.takenOver.Load(),
		Duplicates: r.duplicates.Load(), NotStarted: r.notStarted.Load(), Recovered: r.recovered.Load(),
		Limited: r.limited.Load(), Deferred: r.deferred.Load(),
	}
}

// Queue is one queue a worker pulls from (DESIGN §3): its pool's consumer and
// the consumer of its requests for capabilities no pool lists.
type Queue struct {
	// Name names it: its stream's name.
	Name           string
	Pool, Unrouted jetstream.Consumer
}

// unroutedSlots is how many deliveries of the unrouted consumers a worker
// handles at once, over every queue.
const unroutedSlots = 4

// Serve pulls deliveries from every queue given (those of first at once,
// each sent on more as it comes) and handles each, until ctx ends: up to
// concurrency of its pools' deliveries at once, the queues taking turns
// (turns.go), and a few unrouted ones. Then it stops fetching, lets
// in-flight executions finish within grace, and abandons the rest to a
// takeover. A queue already pulled from is not pulled twice; one whose
// consumer is deleted is let go (Pulling then reports false).
func (r *Runner) Serve(ctx context.Context, first []Queue, more <-chan Queue, concurrency int, grace time.Duration) error {
	if Reserve(concurrency) > 0 {
		// With nothing to keep back (one slot) a share never refuses:
		// deliveries skip it.
		r.share.Store(newFairShare(concurrency))
	}
	p := &pulls{r: r, poolTurns: newTurns(concurrency), unroutedTurns: newTurns(unroutedSlots), batch: concurrency}
	for _, q := range first {
		if err := p.start(q); err != nil {
			p.stop()
			return err
		}
	}
	r.servingOnce.Do(func() { close(r.serving) })
	for running := true; running; {
		select {
		case <-ctx.Done():
			running = false
		case q := <-more:
			if err := p.start(q); err != nil {
				r.log.Warn("queue not pulled; tried again later", "queue", q.Name, "err", err)
			}
		}
	}
	r.log.Info("worker draining", "grace", grace)
	// Drain: stop pulling, hand out what was already buffered.
	p.drain()
	done := make(chan struct{})
	go func() { p.loops.Wait(); p.handlers.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(grace):
		r.log.Warn("grace period over: abandoning in-flight executions to a takeover", "inflight", r.inflightCount())
		r.baseCancel(errShutdown)
		<-done
	}
	r.baseCancel(errShutdown)
	return nil
}

// Pulling reports whether Serve pulls from the queue named name.
func (r *Runner) Pulling(name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pulling[name]
}

// pulls are the pull loops of one Serve.
type pulls struct {
	r                        *Runner
	poolTurns, unroutedTurns *turns
	batch                    int
	loops, handlers          sync.WaitGroup

	mu    sync.Mutex
	iters []jetstream.MessagesContext
}

// start pulls from q, unless it is pulled from already.
func (p *pulls) start(q Queue) error {
	r := p.r
	r.mu.Lock()
	if r.pulling[q.Name] {
		r.mu.Unlock()
		return nil
	}
	r.pulling[q.Name] = true
	r.mu.Unlock()
	pool, err := q.Pool.Messages(jetstream.PullMaxMessages(p.batch), jetstream.PullExpiry(5*time.Second))
	if err != nil {
		r.forget(q.Name)
		return fmt.Errorf("capstan: pull from %s of %s: %w", q.Pool.CachedInfo().Name, q.Name, err)
	}
	unrouted, err := q.Unrouted.Messages(jetstream.PullMaxMessages(unroutedSlots), jetstream.PullExpiry(5*time.Second))
	if err != nil {
		pool.Stop()
		r.forget(q.Name)
		return fmt.Errorf("capstan: pull from %s of %s: %w", q.Unrouted.CachedInfo().Name, q.Name, err)
	}
	p.mu.Lock()
	p.iters = append(p.iters, pool, unrouted)
	p.mu.Unlock()
	p.loops.Add(2)
	go func() {
		defer p.loops.Done()
		if p.pull(q.Name, pool, p.poolTurns, r.handle) {
			// Its pool's consumer is gone: the queue is pulled again once
			// found again.
			unrouted.Stop()
		}
		r.forget(q.Name)
	}()
	go func() {
		defer p.loops.Done()
		p.pull(q.Name, unrouted, p.unroutedTurns, r.handleUnrouted)
	}()
	return nil
}

// pull hands each delivery of it to handle once the loop's turn for a slot
// comes, until it is closed or its consumer deleted (then deleted is true).
func (p *pulls) pull(queue string, it jetstream.MessagesContext, slots *turns, handle func(jetstream.Msg)) (deleted bool) {
	r := p.r
	wake := make(chan struct{}, 1)
	for {
		msg, err := it.Next()
		if err != nil {
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return false
			}
			if errors.Is(err, jetstream.ErrConsumerDeleted) {
				r.log.Warn("consumer deleted: its queue is let go", "queue", queue, "err", err)
				it.Stop()
				return true
			}
			r.log.Warn("pull failed", "queue", queue, "err", err)
			time.Sleep(100 * time.Millisecond) // a consumer electing a leader fails fast
			continue
		}
		// Holding one delivery, the loop waits for its turn: the other
		// queues' loops that wait already go first.
		slots.take(wake)
		p.handlers.Add(1)
		go func() {
			defer func() { slots.give(); p.handlers.Done() }()
			r.handled.Add(1)
			handle(msg)
		}()
	}
}

// drain stops every loop's pulling; what was buffered is still handed out.
func (p *pulls) drain() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, it := range p.iters {
		it.Drain()
	}
}

// stop ends every loop at once (a start that failed).
func (p *pulls) stop() {
	p.mu.Lock()
	for _, it := range p.iters {
		it.Stop()
	}
	p.mu.Unlock()
	p.loops.Wait()
}

func (r *Runner) forget(queue string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.pulling, queue)
}

func (r *Runner) inflightCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.inflight)
}

// start tracks x for its delivery msg. An execution of the same key already
// in flight here keeps it: x is finished and msg NAKed until that one's
// lease could end, and start reports false.
func (r *Runner) start(msg jetstream.Msg, e *Execution) bool {
	if r.track(e) {
		return true
	}
	e.finish()
	nak(msg, r.cfg.Lease)
	return false
}

func (r *Runner) track(e *Execution) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, busy := r.inflight[e.key]; busy {
		return false
	}
	r.inflight[e.key] = e
	return true
}

func (r *Runner) untrack(e *Execution) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.inflight[e.key] == e {
		delete(r.inflight, e.key)
	}
}

func (r *Runner) local(key string) *Execution {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.inflight[key]
}

// CancelLocal stops this worker's run of principal's execution at once, if
// it has one and its record says the caller cancelled it. A notice alone
// proves nothing: the server also publishes on a notice's subject when a
// producer names it as the reply of a request it may make, so the record,
// which only workers write, decides. It is read from the stream's leader,
// which stored the cancel before the notice was sent.
func (r *Runner) CancelLocal(principal, executionID string) {
	key := broker.Key(principal, executionID)
	x := r.local(key)
	if x == nil {
		return
	}
	ctx, cancel := StoreContext()
	rec, _, err := broker.LoadFromLeader[Record](ctx, r.nc, r.b.Executions, key)
	cancel()
	if err != nil || !rec.CancelRequested || rec.ExecutionID != executionID {
		// Not recorded (or not readable): the lease renewal reads the record
		// again and stops the run if a cancel is recorded by then.
		return
	}
	x.cancel(errCallerCancelled)
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

func (r *Runner) emit(ev *audit.Event) {
	ev.Worker = r.cfg.ID
	r.audit.Emit(ev)
}
