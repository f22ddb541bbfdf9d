package executor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/auth"
	"github.com/capstan-dev/capstan/broker"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/delivery"
	"github.com/capstan-dev/capstan/observe"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
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
	// Observer is told what the worker does, for metrics and traces (see
	// package telemetry). Default: nothing is observed.
	Observer observe.Worker
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
	if c.Observer == nil {
		c.Observer = observe.NopWorker{}
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
// and runs them through the pipeline, finalizing one envelope each. The
// machinery of one delivery (claim, lease, attempts, takeover, finalization)
// is internal/delivery's; the stages a capability defines are in stages.go.
type Worker struct {
	nc    *nats.Conn
	reg   *Registry
	cfg   WorkerConfig
	log   *slog.Logger
	b     *broker.Broker
	audit *audit.Emitter
	cat   *catalog
	run   *delivery.Runner
	caps  map[string]*capability
	// grants say what each principal may do (stage 6, decisions, cancels).
	grants *auth.Grants
}

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
		caps: make(map[string]*capability, len(reg.ids))}
	for _, id := range reg.ids {
		w.caps[id] = &capability{b: reg.get(id), w: w}
	}
	w.run = delivery.NewRunner(nc, w.log, delivery.Config{
		ID: cfg.ID, Lease: cfg.Lease, RolloutDelay: cfg.RolloutDelay, StrictAudit: cfg.StrictAudit,
		DisableLeaseRenewal: cfg.DisableLeaseRenewal, Capability: w.lookup,
		Listed:        func(id string) bool { _, ok := w.cat.lookup(id); return ok },
		ResolveResume: w.resolveResume,
		Pool:          cfg.Pool, Observer: cfg.Observer,
	})
	return w, nil
}

// ID is the worker's id.
func (w *Worker) ID() string { return w.cfg.ID }

// Stats returns the worker's counters.
func (w *Worker) Stats() WorkerStats {
	r := w.run.Stats()
	s := WorkerStats{Handled: r.Handled, HandlerCalls: r.HandlerCalls, Finalized: r.Finalized, Conflicts: r.Conflicts,
		Abandoned: r.Abandoned, TakenOver: r.TakenOver, Duplicates: r.Duplicates}
	if w.audit != nil {
		s.AuditFailed = w.audit.Failed()
	}
	return s
}

// lookup is the capability a request names, or nil (never a nil pointer in
// the interface).
func (w *Worker) lookup(id string) delivery.Capability {
	if c, ok := w.caps[id]; ok {
		return c
	}
	return nil
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
	w.grants, err = auth.WatchGrants(ctx, b.JS, b.Names)
	if err != nil {
		return err
	}
	defer w.grants.Stop()
	w.audit = audit.NewEmitter(b, audit.Options{Disabled: w.cfg.DisableAudit, Logger: w.log,
		OnFailure: w.cfg.Observer.AuditFailed})
	w.run.Provisioned(b, w.audit)
	defer w.run.Stop()
	w.cat, err = watchCatalog(w.run.Context(), b)
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

	if err := w.run.Serve(ctx, pool, unrouted, w.cfg.Concurrency, w.cfg.Grace); err != nil {
		return err
	}
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

func (w *Worker) emit(ev *audit.Event) {
	ev.Worker = w.cfg.ID
	w.audit.Emit(ev)
}
