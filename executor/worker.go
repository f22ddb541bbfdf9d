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

	"github.com/capstan-dev/capstan/internal/auditemit"
	"github.com/capstan-dev/capstan/internal/testhooks"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor/internal/control"
	"github.com/capstan-dev/capstan/executor/internal/engine"
	"github.com/capstan-dev/capstan/executor/internal/sweeper"
	"github.com/capstan-dev/capstan/internal/approvalsrpc"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/grantwatch"
	"github.com/capstan-dev/capstan/internal/pauses"
	"github.com/capstan-dev/capstan/internal/policies"
	"github.com/capstan-dev/capstan/observe"
)

// WorkerConfig configures a Worker. Zero values are the defaults.
type WorkerConfig struct {
	// Pool names the worker pool; its consumer is "pool-<name>". Default "default".
	Pool string
	// Concurrency is how many executions run at once. Default 64. A
	// handler that ignores its context past its timeout or a cancel is
	// abandoned (WorkerStats.Abandoned) and no longer counted here, though
	// it runs on; a capability's concurrency limit counts it until it
	// returns.
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
	// Deployment says how resources are named and provisioned.
	Deployment Deployment
	// StrictAudit requires capability.started to be stored before a handler
	// runs; otherwise the execution fails AUDIT_UNAVAILABLE.
	StrictAudit bool
	// RolloutDelay is the longest a request for a capability this worker
	// lacks, but the catalog lists, is left for a worker that serves it
	// before it is delivered again (the first time 100 ms, doubling at each
	// delivery). Default 5 s.
	RolloutDelay time.Duration
	// PolicyTimeout bounds one policy evaluation. Default 1 s.
	PolicyTimeout time.Duration
	// Policies apply to every capability, before the capability's own.
	Policies []Policy
	// Observer is told what the worker does, for metrics and traces (see
	// package telemetry). Default: nothing is observed.
	Observer observe.Worker
	// CatalogTTL is how long the worker's catalog entries last unless renewed;
	// it renews them every third of it. Default 30 s.
	CatalogTTL time.Duration
	// StartupWait bounds how long Run waits for the cluster to be reachable
	// and ready (provisioning, consumers, catalog), retrying with a log line.
	// Default 0: no bound, the worker waits until its context ends.
	StartupWait time.Duration
	// SweepInterval is how often the worker holding the sweeping lease ends
	// the requests no worker started by their deadline (DESIGN §13). Default
	// 30 s, shorter when the record TTL is short; negative: this worker never
	// sweeps.
	SweepInterval time.Duration

	// knobs are the options only the module's tests and benchmarks set
	// (internal/testhooks).
	knobs testhooks.WorkerKnobs
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
	if c.CatalogTTL <= 0 {
		c.CatalogTTL = defaultCatalogTTL
	}
	if c.PolicyTimeout <= 0 {
		c.PolicyTimeout = defaultPolicyTimeout
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
	// NotStarted counts deliveries this worker ended NOT_STARTED; Swept the
	// requests its sweeper ended.
	NotStarted, Swept uint64
	// Limited counts executions a limit held back (waited, refused or sent
	// to an approval; DESIGN §17).
	Limited uint64
	// Deferred counts deliveries left for later because their principal
	// held its fair share of this worker's slots while others were active
	// or had a queue here.
	Deferred uint64
	// AuditFailed counts audit events JetStream did not store.
	AuditFailed uint64
	// Recovered counts executions finalized completed from a lost or
	// stopped attempt's receipt, or its reconciler's finding (DESIGN §5).
	Recovered uint64
	// Held counts deliveries an operator's pause put back in their queue
	// (each time, while it lasts); PauseRefused the calls one ended PAUSED
	// (DESIGN §18).
	Held, PauseRefused uint64
}

// Worker serves one pool: it pulls requests for its registry's capabilities
// and runs them through the pipeline, finalizing one envelope each. The
// machinery of one delivery (claim, lease, attempts, takeover, finalization)
// is the engine's (internal/engine); the stages a capability defines are in stages.go.
type Worker struct {
	nc    *nats.Conn
	reg   *Registry
	cfg   WorkerConfig
	log   *slog.Logger
	b     *broker.Broker
	audit *auditemit.Emitter
	// emitter is audit for Stats, which may run before Run set it.
	emitter atomic.Pointer[auditemit.Emitter]
	cat     *catalog
	run     *engine.Runner
	// sweeper is set while Run sweeps (DESIGN §13).
	sweeper atomic.Pointer[sweeper.Sweeper]
	caps    map[string]*capability
	// grants say what each principal may do (stage 6, decisions, cancels).
	grants *grantwatch.Grants
	// pauses are the operators' pauses (DESIGN §18), watched; cancels the
	// running attempts they cancelled.
	pauses  *pauses.Watcher
	cancels cancelPasses
	// policies is the Cedar policy set in force (DESIGN §18), watched.
	policies *policies.Watcher
	// pauseRefused counts the calls a pause refused at admission.
	pauseRefused atomic.Uint64
	// reading counts the control requests taken and not yet answered.
	reading sync.WaitGroup
	// rates and gate are the control requests' quota and turns (quotas.go);
	// stopping is set once the worker stops taking them.
	rates    control.Rates
	gate     *control.Gate
	stopping atomic.Bool
	// refusals spaces the log lines of refusals by quotas.
	refusalsMu sync.Mutex
	refusals   map[string]refusalLog
	// readOnly coalesces the audit events of read-only requests.
	readOnly readOnlyEvents
	// approvalIndex is the worker's copy of the approvals bucket: pending
	// approvals counted, listings paged.
	approvalIndex *approvalsrpc.Index
}

// skipped is told of a record of bucket that a listing skipped because it
// does not decode: a log line naming it and a count, and nothing else fails.
func (w *Worker) skipped(bucket string) func(key string, err error) {
	return func(key string, err error) {
		w.log.Warn("record does not decode: skipped", "bucket", bucket, "key", key, "err", err)
		w.cfg.Observer.Skipped(bucket)
	}
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
		caps: make(map[string]*capability, len(reg.ids)), refusals: map[string]refusalLog{}}
	served := make(map[string]engine.Definition, len(reg.ids))
	for _, id := range reg.ids {
		c := newCapability(reg.get(id), w)
		w.caps[id], served[id] = c, c
	}
	w.run = engine.NewRunner(nc, w.log, engine.Config{
		ID: cfg.ID, Lease: cfg.Lease, RolloutDelay: cfg.RolloutDelay, StrictAudit: cfg.StrictAudit,
		DisableLeaseRenewal: cfg.knobs.DisableLeaseRenewal, BeforeAttempt: cfg.knobs.BeforeAttempt, Now: cfg.knobs.Clock,
		Capabilities:  served,
		Listed:        func(id string) (bool, error) { return w.cat.listedNow(id) },
		NearName:      w.nearName,
		ResolveResume: w.resolveResume,
		Paused:        w.paused,
		Pool:          cfg.Pool, Observer: cfg.Observer,
	})
	return w, nil
}

// ID is the worker's id.
func (w *Worker) ID() string { return w.cfg.ID }

// Ready is closed once Run serves: the worker's capabilities are listed in
// the catalog, its pool's consumer covers them and the worker pulls from it.
// From then on a call of any of them, from any client, whichever worker of
// the deployment its delivery reaches, is run by a worker that serves it: a
// worker that does not serve a capability the catalog lists leaves its
// requests to one that does (DESIGN §3, which says why the workers of one
// pool should serve the same capabilities). Before then, a call may end
// CAPABILITY_NOT_FOUND when no other worker serves the capability yet.
//
// A program that starts a worker and calls it at once waits here first. If
// Run returns before it serves (an error, or its context ended), Ready is
// never closed: wait for Run's result as well. (A grace period for
// capabilities not yet listed would spare programs the wait, but delay the
// answer a call of a tool that does not exist needs at once.)
func (w *Worker) Ready() <-chan struct{} { return w.run.Serving() }

// Stats returns the worker's counters.
func (w *Worker) Stats() WorkerStats {
	r := w.run.Stats()
	s := WorkerStats{Handled: r.Handled, HandlerCalls: r.HandlerCalls, Finalized: r.Finalized, Conflicts: r.Conflicts,
		Abandoned: r.Abandoned, TakenOver: r.TakenOver, Duplicates: r.Duplicates, NotStarted: r.NotStarted,
		Recovered: r.Recovered, Limited: r.Limited, Deferred: r.Deferred, Held: r.Held,
		PauseRefused: r.PauseRefused + w.pauseRefused.Load()}
	if sw := w.sweeper.Load(); sw != nil {
		s.Swept = sw.Swept()
	}
	if em := w.emitter.Load(); em != nil {
		s.AuditFailed = em.Failed()
	}
	return s
}

// Run provisions the resources, publishes the worker's capabilities to the
// catalog, widens the pool's consumer and serves until ctx ends. Then it stops
// fetching, lets in-flight executions finish within the grace period, abandons
// the rest to a takeover, and returns nil.
func (w *Worker) Run(ctx context.Context) error {
	// Every step of the start waits for the cluster (DESIGN §13).
	var deadline time.Time
	if w.cfg.StartupWait > 0 {
		deadline = time.Now().Add(w.cfg.StartupWait)
	}
	ready := func(what string, step func(ctx context.Context) error) error {
		return w.untilReady(ctx, what, deadline, step)
	}
	var b *broker.Broker
	if err := ready("provision", func(c context.Context) (err error) {
		b, err = broker.Provision(c, w.nc, w.cfg.Deployment.config())
		return err
	}); err != nil {
		return startErr(ctx, err)
	}
	// One record window per deployment (DESIGN §16): a worker set to
	// another refuses to start, one set to none adopts the deployment's.
	if err := ready("agree on the record window", func(c context.Context) error {
		return b.AgreeRecordWindow(c, w.cfg.Deployment.RecordWindow > 0)
	}); err != nil {
		return startErr(ctx, err)
	}
	w.b = b
	if err := ready("compare clocks", w.checkClock); err != nil {
		return startErr(ctx, err)
	}
	if err := ready("read grants", func(c context.Context) (err error) {
		w.grants, err = grantwatch.Watch(ctx, b.JS, b.Names)
		return err
	}); err != nil {
		return startErr(ctx, err)
	}
	defer w.grants.Stop()
	// The operators' pauses, read before the first pull: a worker started
	// while a pause is on honours it from its first delivery.
	if err := ready("read pauses", func(context.Context) (err error) {
		w.pauses, err = pauses.Watch(ctx, b.JS, b.Names, w.log, w.onPause)
		return err
	}); err != nil {
		return startErr(ctx, err)
	}
	defer w.pauses.Stop()
	if err := ready("read policies", func(context.Context) (err error) {
		w.policies, err = policies.Watch(ctx, b.JS, b.Names, w.log)
		return err
	}); err != nil {
		return startErr(ctx, err)
	}
	defer w.policies.Stop()
	w.audit = auditemit.New(b.NC, auditemit.Options{Prefix: b.Names.Prefix(), Audit: b.Audit, Index: b.Index, Disabled: w.cfg.knobs.DisableAudit, Logger: w.log, Unacknowledged: w.cfg.knobs.AuditUnacknowledged,
		OnFailure: w.cfg.Observer.AuditFailed})
	w.emitter.Store(w.audit)
	w.run.Provisioned(b, w.audit)
	defer w.run.Stop()
	if err := ready("watch catalog", func(context.Context) (err error) {
		w.cat, err = watchCatalog(w.run.Context(), b, w.cfg.knobs.CatalogLag, w.skipped(b.Names.CatalogBucket()))
		return err
	}); err != nil {
		return startErr(ctx, err)
	}
	defer w.cat.stop()
	var queues []engine.Queue
	if err := ready("create consumers", func(c context.Context) (err error) {
		queues, err = w.openQueues(c)
		return err
	}); err != nil {
		return startErr(ctx, err)
	}
	if err := ready("read approvals", func(context.Context) (err error) {
		w.approvalIndex, err = approvalsrpc.WatchIndex(ctx, b.Approvals, w.skipped(b.Names.ApprovalsBucket()))
		return err
	}); err != nil {
		return startErr(ctx, err)
	}
	defer w.approvalIndex.Stop()
	w.gate = control.NewGate(controlSlots, controlShare)
	subs, err := w.serveControl()
	if err != nil {
		w.gate.Stop()
		return err
	}
	coalesceCtx, stopCoalescing := context.WithCancel(context.Background())
	coalesced := make(chan struct{})
	go func() { defer close(coalesced); w.coalesce(coalesceCtx) }()
	var stopControl sync.Once
	stopServing := func() {
		stopControl.Do(func() {
			for _, s := range subs {
				_ = s.Unsubscribe()
			}
			// Once the server has the unsubscriptions, no request is routed
			// here to be dropped: the other workers answer it.
			_ = w.nc.FlushTimeout(time.Second)
			w.stopping.Store(true)
			w.gate.Stop()    // what it took is answered
			w.reading.Wait() // and what was refused meanwhile
			stopCoalescing() // the last summaries filed
			<-coalesced
		})
	}
	defer stopServing()
	// Listed last: once the catalog names a capability, its consumer exists
	// and cancel and describe are served.
	if err := ready("publish catalog", w.publishCatalog); err != nil {
		return startErr(ctx, err)
	}
	w.log.Info("worker started", "capabilities", w.reg.ids, "concurrency", w.cfg.Concurrency,
		"recordWindow", b.Config.RecordWindow)
	renewCtx, stopRenew := context.WithCancel(ctx)
	renewed := make(chan struct{})
	go func() { defer close(renewed); w.renewCatalog(renewCtx) }()
	defer func() { stopRenew(); <-renewed }()
	if every := sweepInterval(w.cfg.SweepInterval, b.Config.RecordTTL); every > 0 {
		sweepCtx, stopSweep := context.WithCancel(ctx)
		sw := sweeper.New(b, w.run, sweeper.Config{Worker: w.cfg.ID, Log: w.log, Listed: w.cat.listedNow})
		w.sweeper.Store(sw)
		swept := make(chan struct{})
		go func() { defer close(swept); sw.Run(sweepCtx, every) }()
		defer func() { stopSweep(); <-swept }()
	}

	more := make(chan engine.Queue)
	watchCtx, stopWatch := context.WithCancel(ctx)
	watched := make(chan struct{})
	go func() { defer close(watched); w.watchQueues(watchCtx, more) }()
	defer func() { stopWatch(); <-watched }()
	if err := w.run.Serve(ctx, queues, more, w.cfg.Concurrency, w.cfg.Grace); err != nil {
		return err
	}
	stopServing()
	flushCtx, cancelFlush := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancelFlush()
	_ = w.audit.Flush(flushCtx)
	w.log.Info("worker stopped")
	return nil
}

// sweepInterval is how often the sweeper runs: often enough to end requests
// well before JetStream drops them at the record TTL.
func sweepInterval(configured, ttl time.Duration) time.Duration {
	if configured != 0 {
		return configured
	}
	return min(30*time.Second, ttl/30)
}

// untilReady runs one step of the start until it succeeds, trying again with
// a log line while the cluster is not reachable or not ready, until ctx ends
// or deadline (zero: none) passes. Any other error is returned at once.
func (w *Worker) untilReady(ctx context.Context, what string, deadline time.Time, step func(ctx context.Context) error) error {
	for try := 0; ; try++ {
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := step(sctx)
		cancel()
		if err == nil {
			if try > 0 {
				w.log.Info("cluster ready", "step", what)
			}
			return nil
		}
		if ctx.Err() != nil || !broker.Unreachable(err) || (!deadline.IsZero() && time.Now().After(deadline)) {
			return err
		}
		w.log.Warn("waiting for the cluster: "+what+" failed; retrying", "err", err)
		select {
		case <-ctx.Done():
			return err
		case <-time.After(min(250*time.Millisecond<<min(try, 3), 2*time.Second)):
		}
	}
}

// startErr is Run's answer to a start that did not complete: nil when ctx
// ended meanwhile (the worker was stopped while it waited).
func startErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
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
