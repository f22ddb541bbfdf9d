package delivery

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
	// RolloutDelay is how long a request for a capability this worker lacks,
	// but the catalog lists, waits for a newer worker.
	RolloutDelay time.Duration
	// StrictAudit requires capability.started to be stored before a handler runs.
	StrictAudit bool
	// DisableLeaseRenewal stops lease renewal and InProgress (tests of redelivery).
	DisableLeaseRenewal bool
	// Capability returns the capability a request names, or nil when this
	// worker's registry lacks it.
	Capability func(id string) Capability
	// Listed reports whether the catalog lists a capability (some pool serves it).
	Listed func(id string) bool
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
}

// Stats counts what a runner did.
type Stats struct {
	Handled, HandlerCalls, Finalized, Conflicts, Abandoned, TakenOver, Duplicates uint64
	// NotStarted counts requests this worker ended NOT_STARTED, Swept those
	// its sweeper ended.
	NotStarted, Swept uint64
}

// Runner is the delivery machinery of one worker: it pulls deliveries, and
// claims, runs and finalizes each.
type Runner struct {
	nc    *nats.Conn
	b     *broker.Broker
	audit *audit.Emitter
	cfg   Config
	log   *slog.Logger

	// ids makes the message ids of the requests it forwards.
	ids broker.MsgIDs

	mu       sync.Mutex
	inflight map[string]*Execution

	// base outlives the Serve context: in-flight executions keep running
	// through a graceful shutdown until the grace period ends.
	base       context.Context
	baseCancel context.CancelCauseFunc

	handled, handlerCalls, finalized, conflicts atomic.Uint64
	abandoned, takenOver, duplicates            atomic.Uint64
	notStarted, swept                           atomic.Uint64

	// retention is the envelope retention (nanoseconds) as last read: at
	// the start, then by ReadEnvelopeRetention and before every refusal of
	// a request for its id's age (a server may change it while workers run).
	retention atomic.Int64
}

// Causes that end an execution's context.
var (
	errCallerCancelled = errors.New("cancelled by the caller")
	errDeadline        = errors.New("the request's deadline passed")
	errLeaseLost       = errors.New("the claim was lost to another worker")
	errShutdown        = errors.New("the worker shut down before the execution ended")
	errAttemptTimeout  = errors.New("the attempt timed out")
)

// NewRunner returns the machinery of one worker. Its context ends with Stop.
func NewRunner(nc *nats.Conn, log *slog.Logger, cfg Config) *Runner {
	w := &Runner{nc: nc, cfg: cfg, log: log, inflight: make(map[string]*Execution)}
	var err error
	if w.ids, err = broker.NewMsgIDs(nc); err != nil {
		// The connection signed its own authentication; a key that cannot
		// sign now leaves forwards' message ids without a tag.
		log.Warn("message ids of forwarded requests carry no tag", "err", err)
	}
	w.base, w.baseCancel = context.WithCancelCause(context.Background())
	return w
}

// Provisioned gives the runner the resources its worker provisioned and the
// worker's audit emitter, before it serves anything.
func (w *Runner) Provisioned(b *broker.Broker, em *audit.Emitter) {
	w.b, w.audit = b, em
	w.retention.Store(int64(b.Config.EnvelopeRetention))
}

// envelopeRetention is how long envelopes are kept, as last read (0: for
// ever).
func (w *Runner) envelopeRetention() time.Duration { return time.Duration(w.retention.Load()) }

// ReadEnvelopeRetention reads the envelope retention again where
// provisioning records it, and returns it: a server started with another
// retention changes it while workers run. When it cannot be read, the value
// known is kept and returned.
func (w *Runner) ReadEnvelopeRetention(ctx context.Context) time.Duration {
	if r, err := w.b.EnvelopeRetention(ctx); err == nil {
		w.retention.Store(int64(r))
	}
	return w.envelopeRetention()
}

// olderThanRetention reports whether an id made at made is older than any
// envelope of it is kept (less the margin, broker.MaxStartWithin). It reads
// the retention again before it says so: a refusal by a retention grown
// since would end a request its caller still waits for without an envelope.
func (w *Runner) olderThanRetention(made time.Time) bool {
	old := func(r time.Duration) bool { return r > 0 && time.Since(made) > broker.MaxStartWithin(r) }
	if !old(w.envelopeRetention()) {
		return false
	}
	ctx, cancel := StoreContext()
	defer cancel()
	return old(w.ReadEnvelopeRetention(ctx))
}

// Context ends when the worker shuts down (Stop).
func (w *Runner) Context() context.Context { return w.base }

// Stop ends every execution still running: the worker shut down.
func (w *Runner) Stop() { w.baseCancel(errShutdown) }

// Stats returns the runner's counters.
func (w *Runner) Stats() Stats {
	return Stats{
		Handled: w.handled.Load(), HandlerCalls: w.handlerCalls.Load(), Finalized: w.finalized.Load(),
		Conflicts: w.conflicts.Load(), Abandoned: w.abandoned.Load(), TakenOver: w.takenOver.Load(),
		Duplicates: w.duplicates.Load(), NotStarted: w.notStarted.Load(), Swept: w.swept.Load(),
	}
}

// Serve pulls deliveries from the pool's consumer (up to concurrency at once)
// and from the unrouted one, and handles each, until ctx ends. Then it stops
// fetching, lets in-flight executions finish within grace, and abandons the
// rest to a takeover.
func (w *Runner) Serve(ctx context.Context, pool, unrouted jetstream.Consumer, concurrency int, grace time.Duration) error {
	var wg sync.WaitGroup
	loops := []struct {
		c        jetstream.Consumer
		batch    int
		unrouted bool
	}{
		{pool, concurrency, false},
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
	w.log.Info("worker draining", "grace", grace)
	// Drain: stop pulling, hand out what was already buffered.
	for _, it := range iters {
		it.Drain()
	}
	done := make(chan struct{})
	go func() { loopsDone.Wait(); wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(grace):
		w.log.Warn("grace period over: abandoning in-flight executions to a takeover", "inflight", w.inflightCount())
		w.baseCancel(errShutdown)
		<-done
	}
	w.baseCancel(errShutdown)
	return nil
}

func (w *Runner) inflightCount() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.inflight)
}

// start tracks x for its delivery msg. An execution of the same key already
// in flight here keeps it: x is finished and msg NAKed until that one's
// lease could end, and start reports false.
func (w *Runner) start(msg jetstream.Msg, x *Execution) bool {
	if w.track(x) {
		return true
	}
	x.finish()
	nak(msg, w.cfg.Lease)
	return false
}

func (w *Runner) track(x *Execution) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, busy := w.inflight[x.key]; busy {
		return false
	}
	w.inflight[x.key] = x
	return true
}

func (w *Runner) untrack(x *Execution) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.inflight[x.key] == x {
		delete(w.inflight, x.key)
	}
}

func (w *Runner) local(key string) *Execution {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.inflight[key]
}

// CancelLocal stops this worker's run of principal's execution at once, if
// it has one and its record says the caller cancelled it. A notice alone
// proves nothing: the server also publishes on a notice's subject when a
// producer names it as the reply of a request it may make, so the record,
// which only workers write, decides. It is read from the stream's leader,
// which stored the cancel before the notice was sent.
func (w *Runner) CancelLocal(principal, executionID string) {
	key := broker.Key(principal, executionID)
	x := w.local(key)
	if x == nil {
		return
	}
	ctx, cancel := StoreContext()
	rec, _, err := broker.LoadFromLeader[Record](ctx, w.nc, w.b.Executions, key)
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

// conflict acks, without running it, a request whose execution's record was
// claimed for another request under the same id (Record.Conflict names the
// field that differs), and audits it as a duplicate delivery with the field
// and the record's capability. Nothing of the execution changes: the request
// the record names still decides it.
func (w *Runner) conflict(msg jetstream.Msg, principal string, req *envelope.Request, rec *Record, field string) {
	w.log.Warn("a request differs from the one its execution was claimed for: acknowledged, not run",
		"executionId", req.ExecutionID, "capabilityId", req.CapabilityID, "field", field)
	w.auditDuplicate(principal, req, map[string]any{"conflict": field, "claimedFor": rec.CapabilityID, "claimedBy": rec.Worker})
	ackSync(msg)
}

func (w *Runner) emit(ev *audit.Event) {
	ev.Worker = w.cfg.ID
	w.audit.Emit(ev)
}

// finalizedRecord is the record written when a request is finalized without
// running (undecodable): it keeps the invariant that an envelope is always
// preceded by its execution's record.
// code, kept as LastError, says which envelope the record stands for.
func (w *Runner) finalizedRecord(id, capID string, status envelope.Status, code envelope.Code) *Record {
	now := time.Now().UTC()
	return &Record{V: envelope.Version, ExecutionID: id, CapabilityID: capID, State: StateFinalized,
		Worker: w.cfg.ID, Status: status, LastError: code, CreatedAt: now, UpdatedAt: now}
}
