package engine

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/capstan-dev/capstan/internal/auditemit"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/limits"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

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

// NewRunner returns the machinery of one worker. Its context ends with Stop.
func NewRunner(nc *nats.Conn, log *slog.Logger, cfg Config) *Runner {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	w := &worker{nc: nc, cfg: cfg, log: log, now: cfg.Now, inflight: inflight{m: make(map[string]*flight)}}
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
func (r *Runner) Provisioned(b *broker.Broker, em *auditemit.Emitter) {
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

// EnvelopeRetention is how long envelopes are kept, as last read (0: for
// ever).
func (r *Runner) EnvelopeRetention() time.Duration { return r.w.envelopeRetention() }

// Context ends when the worker shuts down (Stop).
func (r *Runner) Context() context.Context { return r.w.base }

// Serving is closed once Serve pulls from the first queues it was given;
// never, if Serve is never called or fails to start pulling.
func (r *Runner) Serving() <-chan struct{} { return r.serving }

// Stop ends every execution still running: the worker shut down.
func (r *Runner) Stop() { r.w.baseCancel(errShutdown) }

// Stats returns the runner's counters.
func (r *Runner) Stats() Stats { return r.w.stats.snapshot() }

// Queue is one queue a worker pulls from (DESIGN §3): its pool's consumer and
// the consumer of its requests for capabilities no pool lists.
type Queue struct {
	// Name names it: its stream's name.
	Name string
	// Principal is whose queue it is; "" for the shared exec stream.
	Principal      string
	Pool, Unrouted jetstream.Consumer
}

// Serve pulls deliveries from every queue given (those of first at once,
// each sent on more as it comes) and handles each, until ctx ends: up to
// concurrency of its pools' deliveries at once, the queues taking turns
// (turns.go), and a few unrouted ones. Then it stops fetching, lets
// in-flight executions finish within grace, and abandons the rest to a
// takeover. A queue already pulled from is not pulled twice; one whose
// consumer is deleted is let go (Pulling then reports false).
func (r *Runner) Serve(ctx context.Context, first []Queue, more <-chan Queue, concurrency int, grace time.Duration) error {
	w := r.w
	if Reserve(concurrency) > 0 {
		// With nothing to keep back (one slot) a share never refuses:
		// deliveries skip it.
		w.share.Store(newFairShare(concurrency, r.in.servesOther))
	}
	r.in.open(concurrency, r.handle)
	for _, q := range first {
		if err := r.in.pull(q); err != nil {
			r.in.stop()
			return err
		}
	}
	r.servingOnce.Do(func() { close(r.serving) })
	for running := true; running; {
		select {
		case <-ctx.Done():
			running = false
		case q := <-more:
			if err := r.in.pull(q); err != nil {
				w.log.Warn("queue not pulled; tried again later", "queue", q.Name, "err", err)
			}
		}
	}
	w.draining.Store(true)
	w.log.Info("worker draining", "grace", grace)
	r.in.drain(grace, func() {
		w.log.Warn("grace period over: abandoning in-flight executions to a takeover", "inflight", w.inflight.len())
		w.baseCancel(errShutdown)
	})
	w.baseCancel(errShutdown)
	w.releasing.Wait() // a slot being given back as the worker stops
	return nil
}

// Pulling reports whether Serve pulls from the queue named name.
func (r *Runner) Pulling(name string) bool { return r.in.pulls(name) }

// handle carries one delivery through the engine: of a pool's consumer, or
// of an unrouted one (requests a producer sent there because its catalog
// did not list the capability).
func (r *Runner) handle(msg jetstream.Msg, unrouted bool) {
	r.w.stats.handled.Add(1)
	d := arrive(r.w, msg, unrouted)
	d.pass()
}

// CancelLocal stops this worker's run of principal's execution at once, if
// it has one and its record says the caller cancelled it. A notice alone
// proves nothing: the server also publishes on a notice's subject when a
// producer names it as the reply of a request it may make, so the record,
// which only workers write, decides. It is read from the stream's leader,
// which stored the cancel before the notice was sent.
func (r *Runner) CancelLocal(principal, executionID string) {
	key := broker.Key(principal, executionID)
	cancel := r.w.inflight.notice(key, r.w.now())
	if cancel == nil {
		return // kept, for a read without a claim that arrives later
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
