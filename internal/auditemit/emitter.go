package auditemit

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/msgenc"
)

// Options configure an Emitter. Zero values are the defaults.
type Options struct {
	// Prefix of the deployment's names (default "CAPSTAN").
	Prefix string
	// Audit is the audit stream, as bound where the emitter is made: when it
	// allows batches, asynchronous events go in batches. Nil: one by one.
	Audit jetstream.Stream
	// Index is the executions index stream: every message that begins or
	// ends an execution gets its entry there. Nil: no entries (a client's
	// emitter).
	Index jetstream.Stream
	// Disabled turns the trail off (benchmarks only; nothing is published).
	Disabled bool
	// Logger receives emission errors of asynchronous events.
	Logger *slog.Logger
	// AckTimeout bounds a strict emission, the wait for an asynchronous
	// event's acknowledgement, and the wait for room when JetStream falls
	// behind. Default 5 s.
	AckTimeout time.Duration
	// OnFailure, when set, is called for each event JetStream did not store
	// (for metrics; it must not block).
	OnFailure func()
	// Unacknowledged publishes asynchronous events (Emit, EmitAll) without
	// asking JetStream for an acknowledgement: one message to the server per
	// EmitAll instead of a publish and its acknowledgement. A failure is then
	// counted only when the publish fails on this side (the connection is
	// closed, or its buffer full while reconnecting); an event the stream
	// refuses (full, unavailable) is lost without a count. Order is kept.
	// Strict emissions (EmitSync, EmitAllSync) are always acknowledged.
	Unacknowledged bool
}

// Emitter publishes events. Events of one execution are published in the order
// Emit is called, from one connection, so the stream keeps pipeline order.
// EmitAll publishes several events of one execution as one message, which the
// stream stores whole or not at all; a reader gets them back in order.
//
// An asynchronous event is published once: a failure is logged and counted,
// never retried, since a retried event would land after events emitted later
// and break the order. When JetStream falls behind, Emit waits (up to
// AckTimeout) for room instead of dropping the event.
type Emitter struct {
	nc     *nats.Conn
	js     jetstream.JetStream
	names  broker.Names
	opts   Options
	failed atomic.Uint64
	sent   atomic.Uint64
	// The batcher of asynchronous events, made at the first one (batcher):
	// an emitter used for strict events only subscribes to nothing. None:
	// asynchronous events are acknowledged one by one.
	batchable bool
	batchOnce sync.Once
	batch     atomic.Pointer[batcher]
	// The executions index (index.go): an entry for each message that
	// begins or ends an execution, in a fast batch of its own, ends coalesced
	// (indexgroups.go). indexed is false when the broker has no index stream
	// (a client's emitter).
	indexed      bool
	groups       *indexGroups
	indexOnce    sync.Once
	indexBatch   atomic.Pointer[batcher]
	indexFailed  atomic.Uint64
	indexBatches bool
}

// ErrMixedExecutions is returned (or, for EmitAll, counted and logged) when
// one call is given events of more than one execution.
var ErrMixedExecutions = errors.New("capstan: audit events of different executions in one message")

// New returns an emitter publishing on the audit stream over nc.
func New(nc *nats.Conn, opts Options) *Emitter {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.AckTimeout <= 0 {
		opts.AckTimeout = 5 * time.Second
	}
	n := broker.NewNames(opts.Prefix)
	e := &Emitter{nc: nc, names: n, opts: opts}
	js, err := jetstream.New(nc,
		jetstream.WithPublishAsyncMaxPending(16384),
		jetstream.WithPublishAsyncTimeout(opts.AckTimeout),
		jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, m *nats.Msg, err error) {
			e.fail(eventCount(m.Data))
			e.opts.Logger.Warn("audit event not stored", "execution", m.Header.Get(broker.AuditExecutionHeader),
				"events", eventCount(m.Data), "err", err)
		}))
	if err != nil {
		// jetstream.New fails only on invalid options.
		panic(err)
	}
	e.js = js
	e.batchable = !opts.Disabled && !opts.Unacknowledged && opts.Audit != nil && opts.Audit.CachedInfo().Config.AllowBatchPublish
	e.indexed = !opts.Disabled && opts.Index != nil
	e.indexBatches = e.indexed && !opts.Unacknowledged && opts.Index.CachedInfo().Config.AllowBatchPublish
	e.groups = newIndexGroups(n, e.sendIndex)
	return e
}

// indexBatcher returns the batcher of index entries, made on first use; nil
// when the index stream does not take batches.
func (e *Emitter) indexBatcher() *batcher {
	e.indexOnce.Do(func() {
		if !e.indexBatches {
			return
		}
		b, err := newBatcher(e.nc, e.opts.AckTimeout, e.opts.Logger, "index entry", func(n int) { e.indexFailed.Add(uint64(n)) })
		if err != nil {
			e.opts.Logger.Warn("index entries acknowledged one by one", "err", err)
			return
		}
		e.indexBatch.Store(b)
	})
	return e.indexBatch.Load()
}

// IndexFailed counts index entries JetStream did not store: executions a
// listing misses (their trails and envelopes are whole).
func (e *Emitter) IndexFailed() uint64 { return e.indexFailed.Load() }

// index files the index entry of evs, a message of the trail, if they begin
// or end an execution: asynchronously, whatever the trail's mode, since a
// listing is no evidence; an end may wait a moment for others
// (indexgroups.go). Called after the trail's message was handed over, so
// that an entry never names an execution whose trail was refused first.
func (e *Emitter) index(evs []*audit.Event) {
	if !e.indexed {
		return
	}
	entry := entryOf(evs)
	if entry == nil {
		return
	}
	if err := e.groups.add(entry); err != nil {
		e.indexFailed.Add(1)
		e.opts.Logger.Warn("index entry not published", "executionId", entry.ExecutionID, "status", entry.Status, "err", err)
	}
}

// sendIndex publishes a message of the index: its entries are counted and
// logged when it fails.
func (e *Emitter) sendIndex(g *indexGroup) {
	defer g.release()
	m := &nats.Msg{Subject: g.subject, Data: g.payload()}
	var err error
	switch batch := e.indexBatcher(); {
	case e.opts.Unacknowledged:
		err = e.nc.PublishMsg(m)
	case batch != nil:
		err = batch.publish(m, g.n, g.key)
	default:
		err = errBatchOff
	}
	if errors.Is(err, errBatchOff) {
		m.Data = bytes.Clone(m.Data)
		_, err = e.js.PublishMsgAsync(m, jetstream.WithRetryAttempts(0), jetstream.WithStallWait(e.opts.AckTimeout))
	}
	if err != nil {
		e.indexFailed.Add(uint64(g.n))
		e.opts.Logger.Warn("index entries not published", "entries", g.n, "first", g.key, "subject", g.subject, "err", err)
	}
}

// batcher returns the batcher of asynchronous events, made on first use; nil
// when the stream does not take batches.
func (e *Emitter) batcher() *batcher {
	e.batchOnce.Do(func() {
		if !e.batchable {
			return
		}
		b, err := newBatcher(e.nc, e.opts.AckTimeout, e.opts.Logger, "audit event", e.fail)
		if err != nil {
			e.opts.Logger.Warn("audit events acknowledged one by one", "err", err)
			return
		}
		e.batch.Store(b)
	})
	return e.batch.Load()
}

func (e *Emitter) fail(events int) {
	e.failed.Add(uint64(events))
	if e.opts.OnFailure != nil {
		for range events {
			e.opts.OnFailure()
		}
	}
}

// Failed counts asynchronous events JetStream did not store.
func (e *Emitter) Failed() uint64 { return e.failed.Load() }

// Sent counts events handed to JetStream.
func (e *Emitter) Sent() uint64 { return e.sent.Load() }

// message encodes evs, all of one execution, as one message on the
// execution's shard: a single event as itself, several as an array of events
// (see audit.Decode). The message's data is enc's: release enc once it is written.
func (e *Emitter) message(evs []*audit.Event) (m *nats.Msg, enc msgenc.Encoded, err error) {
	first := evs[0]
	now := time.Time{}
	for _, ev := range evs {
		if ev.ExecutionID != first.ExecutionID || principal(ev) != principal(first) {
			return nil, enc, fmt.Errorf("%w: %q and %q", ErrMixedExecutions, first.Key(), ev.Key())
		}
		ev.V = envelope.Version
		if ev.Timestamp.IsZero() {
			if now.IsZero() {
				now = time.Now().UTC()
			}
			ev.Timestamp = now
		}
	}
	if len(evs) == 1 {
		enc, err = msgenc.Encode(evs[0])
	} else {
		enc, err = msgenc.Encode(evs)
	}
	if err != nil {
		return nil, enc, err
	}
	key := first.Key()
	return &nats.Msg{
		Subject: e.names.AuditSubject(key),
		Header:  nats.Header{broker.AuditExecutionHeader: []string{key}},
		Data:    enc.Bytes(),
	}, enc, nil
}

// principal is ev's principal, the anonymous one when it names none, as
// audit.Event.Key reads it.
func principal(ev *audit.Event) string {
	if ev.Principal == "" {
		return broker.Anonymous
	}
	return ev.Principal
}

// Emit publishes ev without waiting for JetStream's acknowledgement. A failure
// is logged and counted; it never fails the execution.
func (e *Emitter) Emit(ev *audit.Event) { e.EmitAll(ev) }

// EmitAll publishes evs, events of one execution, in order, as one message,
// without waiting for JetStream's acknowledgement. A failure is logged and
// counted (once per event); it never fails the execution.
func (e *Emitter) EmitAll(evs ...*audit.Event) {
	if e == nil || e.opts.Disabled || len(evs) == 0 {
		return
	}
	m, enc, err := e.message(evs)
	if err == nil {
		switch batch := e.batcher(); {
		case e.opts.Unacknowledged:
			err = e.nc.PublishMsg(m)
		case batch != nil:
			err = batch.publish(m, len(evs), m.Header.Get(broker.AuditExecutionHeader))
		default:
			err = errBatchOff
		}
		if errors.Is(err, errBatchOff) {
			m.Data = bytes.Clone(m.Data) // kept until its acknowledgement
			_, err = e.js.PublishMsgAsync(m, jetstream.WithRetryAttempts(0), jetstream.WithStallWait(e.opts.AckTimeout))
		}
		enc.Release()
	}
	if err != nil {
		e.fail(len(evs))
		e.opts.Logger.Warn("audit event not published", "type", evs[0].Type, "events", len(evs),
			"executionId", evs[0].ExecutionID, "err", err)
		return
	}
	e.sent.Add(uint64(len(evs)))
	e.index(evs)
}

// EmitSync publishes ev and waits until JetStream has stored it. Earlier
// asynchronous events of the same connection are stored before it.
func (e *Emitter) EmitSync(ctx context.Context, ev *audit.Event) error { return e.EmitAllSync(ctx, ev) }

// EmitAllSync publishes evs, events of one execution, in order, as one
// message, and waits until JetStream has stored it: all of them, or none.
// Earlier asynchronous events of the same connection are stored before them.
func (e *Emitter) EmitAllSync(ctx context.Context, evs ...*audit.Event) error {
	if e == nil || e.opts.Disabled || len(evs) == 0 {
		return nil
	}
	m, enc, err := e.message(evs)
	if err != nil {
		e.fail(len(evs))
		return fmt.Errorf("%w: %w", audit.ErrUnavailable, err)
	}
	defer enc.Release()
	ctx, cancel := context.WithTimeout(ctx, e.opts.AckTimeout)
	defer cancel()
	if _, err := e.js.PublishMsg(ctx, m); err != nil {
		e.fail(len(evs))
		return fmt.Errorf("%w: %w", audit.ErrUnavailable, err)
	}
	e.sent.Add(uint64(len(evs)))
	e.index(evs)
	return nil
}

// Flush publishes the index entries that wait for others and waits until
// every asynchronous event has been acknowledged or ctx ends. With
// Options.Unacknowledged it waits until the server has read every event
// published so far, which it stores, in order, right after.
func (e *Emitter) Flush(ctx context.Context) error {
	if e == nil || e.opts.Disabled {
		return nil
	}
	if e.indexed {
		e.groups.flush() // the ends waiting for others go now
	}
	if e.opts.Unacknowledged {
		fctx := ctx
		if _, ok := ctx.Deadline(); !ok {
			var cancel context.CancelFunc
			fctx, cancel = context.WithTimeout(ctx, e.opts.AckTimeout)
			defer cancel()
		}
		if err := e.nc.FlushWithContext(fctx); err != nil {
			return err
		}
	}
	for _, batch := range []*batcher{e.batch.Load(), e.indexBatch.Load()} {
		if batch == nil {
			continue
		}
		select {
		case <-batch.flush():
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	select {
	case <-e.js.PublishAsyncComplete():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
