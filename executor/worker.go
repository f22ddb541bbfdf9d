package executor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/broker"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// WorkerConfig configures a Worker. Zero values are the defaults.
type WorkerConfig struct {
	// Pool names the worker pool; its consumer is "pool-<name>". Default "default".
	Pool string
	// Concurrency is how many executions run at once. Default 64.
	Concurrency int
	// Lease is how long a claim holds without renewal; it is renewed every
	// third of it while a handler runs. Default 30 s.
	Lease time.Duration
	// Grace is how long a shutdown waits for in-flight executions before it
	// abandons them to a takeover. Default 30 s.
	Grace time.Duration
	// ID names the worker in records, envelopes and audit. Default host-pid-random.
	ID string
	// Logger receives the worker's logs. Default: discarded.
	Logger *slog.Logger
	// Broker says how resources are named and provisioned.
	Broker broker.Config
	// StrictAudit requires capability.started to be stored before a handler
	// runs; otherwise the execution fails AUDIT_UNAVAILABLE.
	StrictAudit bool
	// DisableAudit publishes no audit events (for measuring the trail's cost).
	DisableAudit bool
	// RolloutDelay is how long a request for a capability this worker lacks,
	// but the catalog lists, waits for a newer worker. Default 5 s.
	RolloutDelay time.Duration
	// PolicyTimeout bounds one policy evaluation. Default 1 s.
	PolicyTimeout time.Duration
	// Policies apply to every capability, before the capability's own.
	Policies []Policy
	// DisableLeaseRenewal stops lease renewal and InProgress, so JetStream
	// redelivers a long execution while it runs. Only for tests of redelivery.
	DisableLeaseRenewal bool
}

func (c WorkerConfig) withDefaults() WorkerConfig {
	if c.Pool == "" {
		c.Pool = "default"
	}
	if c.Concurrency <= 0 {
		c.Concurrency = 64
	}
	if c.Lease <= 0 {
		c.Lease = 30 * time.Second
	}
	if c.Grace <= 0 {
		c.Grace = 30 * time.Second
	}
	if c.ID == "" {
		host, _ := os.Hostname()
		c.ID = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), uuid.NewString()[:8])
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.RolloutDelay <= 0 {
		c.RolloutDelay = 5 * time.Second
	}
	if c.PolicyTimeout <= 0 {
		c.PolicyTimeout = DefaultPolicyTimeout
	}
	return c
}

// WorkerStats counts what a worker did.
type WorkerStats struct {
	// Handled counts deliveries taken from JetStream.
	Handled uint64
	// HandlerCalls counts handler invocations (attempts).
	HandlerCalls uint64
	// Finalized counts envelopes this worker created.
	Finalized uint64
	// Conflicts counts finalizations refused because an envelope existed.
	Conflicts uint64
	// Abandoned counts handlers left running after a timeout, cancel or
	// shutdown; their late output is never used.
	Abandoned uint64
	// TakenOver counts executions taken over from a lost worker.
	TakenOver uint64
	// Duplicates counts deliveries of already finalized executions.
	Duplicates uint64
	// AuditFailed counts audit events JetStream did not store.
	AuditFailed uint64
}

// Worker serves one pool: it pulls requests for its registry's capabilities
// and runs them through the pipeline, finalizing one envelope each.
type Worker struct {
	nc    *nats.Conn
	reg   *Registry
	cfg   WorkerConfig
	log   *slog.Logger
	b     *broker.Broker
	audit *audit.Emitter
	cat   *catalog

	mu       sync.Mutex
	inflight map[string]*execution

	// base outlives the Run context: in-flight executions keep running
	// through a graceful shutdown until the grace period ends.
	base       context.Context
	baseCancel context.CancelCauseFunc

	handled, handlerCalls, finalized, conflicts atomic.Uint64
	abandoned, takenOver, duplicates            atomic.Uint64
}

// Causes that end an execution's context.
var (
	errCallerCancelled = errors.New("cancelled by the caller")
	errDeadline        = errors.New("the request's deadline passed")
	errLeaseLost       = errors.New("the claim was lost to another worker")
	errShutdown        = errors.New("the worker shut down before the execution ended")
	errAttemptTimeout  = errors.New("the attempt timed out")
)

// NewWorker checks its arguments; Run connects the worker to its pool.
func NewWorker(nc *nats.Conn, reg *Registry, cfg WorkerConfig) (*Worker, error) {
	if nc == nil {
		return nil, errors.New("capstan: NewWorker needs a NATS connection")
	}
	if reg == nil || len(reg.ids) == 0 {
		return nil, ErrEmptyRegistry
	}
	cfg = cfg.withDefaults()
	if err := envelope.ValidExecutionID(cfg.Pool); err != nil {
		return nil, fmt.Errorf("capstan: pool name %q: letters, digits, - and _ only", cfg.Pool)
	}
	w := &Worker{nc: nc, reg: reg, cfg: cfg, log: cfg.Logger.With("worker", cfg.ID, "pool", cfg.Pool),
		inflight: make(map[string]*execution)}
	w.base, w.baseCancel = context.WithCancelCause(context.Background())
	return w, nil
}

// ID is the worker's id.
func (w *Worker) ID() string { return w.cfg.ID }

// Stats returns the worker's counters.
func (w *Worker) Stats() WorkerStats {
	s := WorkerStats{
		Handled: w.handled.Load(), HandlerCalls: w.handlerCalls.Load(), Finalized: w.finalized.Load(),
		Conflicts: w.conflicts.Load(), Abandoned: w.abandoned.Load(), TakenOver: w.takenOver.Load(),
		Duplicates: w.duplicates.Load(),
	}
	if w.audit != nil {
		s.AuditFailed = w.audit.Failed()
	}
	return s
}

// Run provisions the resources, publishes the worker's capabilities to the
// catalog, widens the pool's consumer and serves until ctx ends. Then it stops
// fetching, lets in-flight executions finish within the grace period, abandons
// the rest to a takeover, and returns nil.
func (w *Worker) Run(ctx context.Context) error {
	setupCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	b, err := broker.Provision(setupCtx, w.nc, w.cfg.Broker)
	if err != nil {
		return err
	}
	w.b = b
	w.audit = audit.NewEmitter(b, audit.Options{Disabled: w.cfg.DisableAudit, Logger: w.log})
	w.cat, err = watchCatalog(w.base, b)
	if err != nil {
		return err
	}
	defer w.cat.stop()
	ackWait := w.cfg.Lease
	pool, err := b.EnsurePool(setupCtx, broker.PoolConfig{
		Pool: w.cfg.Pool, Capabilities: w.reg.ids, MaxAckPending: poolMaxAckPending(w.cfg.Concurrency), AckWait: ackWait,
	})
	if err != nil {
		return err
	}
	unrouted, err := b.EnsureUnrouted(setupCtx, 1000, ackWait)
	if err != nil {
		return err
	}
	subs, err := w.serveControl()
	if err != nil {
		return err
	}
	defer func() {
		for _, s := range subs {
			_ = s.Unsubscribe()
		}
	}()
	// Listed last: once the catalog names a capability, its consumer exists
	// and cancel and describe are served.
	if err := w.publishCatalog(setupCtx); err != nil {
		return err
	}
	w.log.Info("worker started", "capabilities", w.reg.ids, "concurrency", w.cfg.Concurrency)

	var wg sync.WaitGroup
	loops := []struct {
		c        jetstream.Consumer
		batch    int
		unrouted bool
	}{
		{pool, w.cfg.Concurrency, false},
		{unrouted, 4, true},
	}
	iters := make([]jetstream.MessagesContext, 0, len(loops))
	var loopsDone sync.WaitGroup
	for _, l := range loops {
		it, err := l.c.Messages(jetstream.PullMaxMessages(l.batch), jetstream.PullExpiry(5*time.Second))
		if err != nil {
			for _, it := range iters {
				it.Stop()
			}
			return fmt.Errorf("capstan: pull from %s: %w", l.c.CachedInfo().Name, err)
		}
		iters = append(iters, it)
		loopsDone.Add(1)
		go func(it jetstream.MessagesContext, unrouted bool, sem chan struct{}) {
			defer loopsDone.Done()
			for {
				sem <- struct{}{}
				msg, err := it.Next()
				if err != nil {
					<-sem
					if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
						return
					}
					w.log.Warn("pull failed", "err", err)
					time.Sleep(100 * time.Millisecond) // a consumer electing a leader fails fast
					continue
				}
				wg.Add(1)
				go func() {
					defer func() { <-sem; wg.Done() }()
					w.handled.Add(1)
					if unrouted {
						w.handleUnrouted(msg)
					} else {
						w.handle(msg)
					}
				}()
			}
		}(it, l.unrouted, make(chan struct{}, l.batch))
	}

	<-ctx.Done()
	w.log.Info("worker draining", "grace", w.cfg.Grace)
	// Drain: stop pulling, hand out what was already buffered.
	for _, it := range iters {
		it.Drain()
	}
	done := make(chan struct{})
	go func() { loopsDone.Wait(); wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(w.cfg.Grace):
		w.log.Warn("grace period over: abandoning in-flight executions to a takeover", "inflight", w.inflightCount())
		w.baseCancel(errShutdown)
		<-done
	}
	w.baseCancel(errShutdown)
	flushCtx, cancelFlush := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancelFlush()
	_ = w.audit.Flush(flushCtx)
	w.log.Info("worker stopped")
	return nil
}

// poolMaxAckPending bounds the pool's unacknowledged deliveries. The limit is
// the whole pool's, not one worker's: it must cover every worker's running and
// buffered messages, or the workers that start last get nothing.
func poolMaxAckPending(concurrency int) int {
	return max(64*concurrency, 20000)
}

func (w *Worker) inflightCount() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.inflight)
}

func (w *Worker) track(x *execution) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, busy := w.inflight[x.req.ExecutionID]; busy {
		return false
	}
	w.inflight[x.req.ExecutionID] = x
	return true
}

func (w *Worker) untrack(x *execution) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.inflight[x.req.ExecutionID] == x {
		delete(w.inflight, x.req.ExecutionID)
	}
}

func (w *Worker) local(id string) *execution {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.inflight[id]
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

func (w *Worker) emit(ev *audit.Event) {
	ev.Worker = w.cfg.ID
	w.audit.Emit(ev)
}

// newAffectedRecord is the record written when a request is finalized without
// running (undecodable, unknown capability): it keeps the invariant that an
// envelope is always preceded by its execution's record.
func (w *Worker) finalizedRecord(id, capID string, status envelope.Status) *Record {
	now := time.Now().UTC()
	return &Record{V: envelope.Version, ExecutionID: id, CapabilityID: capID, State: StateFinalized,
		Worker: w.cfg.ID, Status: status, CreatedAt: now, UpdatedAt: now}
}
