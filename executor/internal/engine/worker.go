package engine

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/auditemit"
	"github.com/capstan-dev/capstan/internal/broker"
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
	// Paused reports the operators' pause that stops principal's request
	// now (DESIGN §18), nil when none does. It is asked before every
	// attempt starts and, while it answers anything, of every delivery: it
	// must answer from memory. Nil: nothing is ever paused.
	Paused func(principal string, req *envelope.Request) *Pause
	// BeforeAttempt, when set, is called once an execution's first attempt
	// on this worker has passed its pause gate and its limits, before its
	// record says it runs (tests of what a pause does to an attempt about
	// to start).
	BeforeAttempt func(executionID string, attempt int)
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
	// held its fair share of the slots while others were active or had a
	// queue here.
	Deferred uint64
	// Recovered counts executions this worker finalized completed from a
	// lost attempt's receipt or its reconciler's finding (DESIGN §5).
	Recovered uint64
	// Held counts deliveries an operator's pause put back in their queue;
	// PauseRefused the executions one ended PAUSED (DESIGN §18).
	Held, PauseRefused uint64
}

// worker is what the deliveries of one worker share: its configuration,
// clock and log, the store of records and envelopes, the trail, the limits,
// the fair share, the table of executions in flight and the counters. Its
// parts call no delivery back.
type worker struct {
	nc    *nats.Conn
	b     *broker.Broker
	audit *auditemit.Emitter
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
	// draining is set once Serve stops pulling: a delivery it still hands
	// out begins nothing new and is left to a live worker.
	draining atomic.Bool
	// releasing counts the slots to give back once an abandoned handler
	// returns (releaseLimits): Serve returns once they are.
	releasing sync.WaitGroup

	inflight inflight
	stats    stats
	// share is the fair share of the pool's slots between principals, set
	// by Serve.
	share atomic.Pointer[fairShare]
	// waits are the waits at a limit put on the trail lately.
	waits waitsFiled
	// retention is the envelope retention (nanoseconds) as last read: at
	// the start, then by ReadEnvelopeRetention and before every refusal of
	// a request for its id's age (a server may change it while workers run).
	retention atomic.Int64
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

// duplicate audits a delivery of principal's req that runs nothing (an
// execution already finalized, a request its execution was not claimed for)
// with data: execution.duplicate_delivery, never a second call.
func (w *worker) duplicate(principal string, req *envelope.Request, data map[string]any) {
	w.stats.duplicates.Add(1)
	w.emit(&audit.Event{Type: audit.EventDuplicateDelivery, Surface: req.Surface, Actor: audit.ActorOf(req.Actor),
		Principal: principal, ExecutionID: req.ExecutionID, CapabilityID: req.CapabilityID, CorrelationID: req.CorrelationID,
		TraceID: auditemit.TraceID(req.Traceparent), Data: data})
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
	// held and pauseRefused count what operators' pauses stopped.
	held, pauseRefused atomic.Uint64
}

// snapshot is the counters now.
func (s *stats) snapshot() Stats {
	return Stats{
		Handled: s.handled.Load(), HandlerCalls: s.handlerCalls.Load(), Finalized: s.finalized.Load(),
		Conflicts: s.conflicts.Load(), Abandoned: s.abandoned.Load(), TakenOver: s.takenOver.Load(),
		Duplicates: s.duplicates.Load(), NotStarted: s.notStarted.Load(), Recovered: s.recovered.Load(),
		Limited: s.limited.Load(), Deferred: s.deferred.Load(), Held: s.held.Load(), PauseRefused: s.pauseRefused.Load(),
	}
}

// inflight is the table of the executions this worker runs, by key, each
// with the end of its context: a redelivery of one of them is left to it,
// and a caller's cancel reaches it at once (Runner.CancelLocal), an
// operator's pause too (Runner.CancelRunning).
type inflight struct {
	mu sync.Mutex
	m  map[string]*flight
	// noticed are the keys of executions a cancel notice named while none
	// of them was in flight here, with when: a read without a claim looks
	// here, not at the record, before it runs (delivery.runUnclaimed).
	noticed map[string]time.Time
}

// keepNotices bounds how many cancel notices a worker keeps for executions
// not in flight; past it, those older than noticeAge go, then all.
const (
	keepNotices = 4096
	noticeAge   = time.Minute
)

// notice takes a cancel notice of key: the end of the context of its
// execution in flight here, to be acted on at once; or, with none in
// flight, nil, and the notice is kept (wasNoticed).
func (t *inflight) notice(key string, now time.Time) context.CancelCauseFunc {
	t.mu.Lock()
	defer t.mu.Unlock()
	if f, ok := t.m[key]; ok {
		return f.cancel
	}
	if len(t.noticed) >= keepNotices {
		for k, at := range t.noticed {
			if now.Sub(at) > noticeAge {
				delete(t.noticed, k)
			}
		}
		if len(t.noticed) >= keepNotices {
			clear(t.noticed)
		}
	}
	if t.noticed == nil {
		t.noticed = map[string]time.Time{}
	}
	t.noticed[key] = now
	return nil
}

// wasNoticed reports whether a cancel notice named key.
func (t *inflight) wasNoticed(key string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.noticed[key]
	return ok
}

// flight is one execution in flight: whose and which, the end of its
// context, and where its attempt is.
type flight struct {
	cancel    context.CancelCauseFunc
	principal string
	req       *envelope.Request
	// starting: its attempt passed its pause gate and its handler has not
	// begun; calling: its handler runs (DESIGN §18).
	starting, calling atomic.Bool
}

// add enters f under key, unless an execution of it is in flight here
// already. Only a delivery whose add succeeded removes key.
func (t *inflight) add(key string, f *flight) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, busy := t.m[key]; busy {
		return false
	}
	t.m[key] = f
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
	if f := t.m[key]; f != nil {
		return f.cancel
	}
	return nil
}

// each is every execution in flight now for which keep is true.
func (t *inflight) each(keep func(*flight) bool) []*flight {
	t.mu.Lock()
	defer t.mu.Unlock()
	var fs []*flight
	for _, f := range t.m {
		if keep(f) {
			fs = append(fs, f)
		}
	}
	return fs
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
