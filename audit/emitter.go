package audit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/capstan-dev/capstan/broker"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrUnavailable marks an event JetStream did not acknowledge when it had to.
var ErrUnavailable = errors.New("capstan: audit unavailable")

// Options configure an Emitter. Zero values are the defaults.
type Options struct {
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
}

// Emitter publishes events. Events of one execution are published in the order
// Emit is called, from one connection, so the stream keeps pipeline order.
//
// An asynchronous event is published once: a failure is logged and counted,
// never retried, since a retried event would land after events emitted later
// and break the order. When JetStream falls behind, Emit waits (up to
// AckTimeout) for room instead of dropping the event.
type Emitter struct {
	js     jetstream.JetStream
	names  broker.Names
	opts   Options
	failed atomic.Uint64
	sent   atomic.Uint64
}

// NewEmitter returns an emitter publishing on b's audit stream.
func NewEmitter(b *broker.Broker, opts Options) *Emitter {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.AckTimeout <= 0 {
		opts.AckTimeout = 5 * time.Second
	}
	e := &Emitter{names: b.Names, opts: opts}
	js, err := jetstream.New(b.NC,
		jetstream.WithPublishAsyncMaxPending(16384),
		jetstream.WithPublishAsyncTimeout(opts.AckTimeout),
		jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, m *nats.Msg, err error) {
			e.fail()
			e.opts.Logger.Warn("audit event not stored", "subject", m.Subject, "err", err)
		}))
	if err != nil {
		// jetstream.New fails only on invalid options.
		panic(err)
	}
	e.js = js
	return e
}

func (e *Emitter) fail() {
	e.failed.Add(1)
	if e.opts.OnFailure != nil {
		e.opts.OnFailure()
	}
}

// Failed counts asynchronous events JetStream did not store.
func (e *Emitter) Failed() uint64 { return e.failed.Load() }

// Sent counts events handed to JetStream.
func (e *Emitter) Sent() uint64 { return e.sent.Load() }

func (e *Emitter) message(ev *Event) (*nats.Msg, error) {
	ev.V = envelope.Version
	if ev.Timestamp.IsZero() {
		ev.Timestamp = time.Now().UTC()
	}
	b, err := envelope.Marshal(ev)
	if err != nil {
		return nil, err
	}
	return &nats.Msg{Subject: e.names.AuditSubject(ev.ExecutionID), Data: b}, nil
}

// Emit publishes ev without waiting for JetStream's acknowledgement. A failure
// is logged and counted; it never fails the execution.
func (e *Emitter) Emit(ev *Event) {
	if e == nil || e.opts.Disabled {
		return
	}
	m, err := e.message(ev)
	if err == nil {
		_, err = e.js.PublishMsgAsync(m, jetstream.WithRetryAttempts(0), jetstream.WithStallWait(e.opts.AckTimeout))
	}
	if err != nil {
		e.fail()
		e.opts.Logger.Warn("audit event not published", "type", ev.Type, "executionId", ev.ExecutionID, "err", err)
		return
	}
	e.sent.Add(1)
}

// EmitSync publishes ev and waits until JetStream has stored it. Earlier
// asynchronous events of the same connection are stored before it.
func (e *Emitter) EmitSync(ctx context.Context, ev *Event) error {
	if e == nil || e.opts.Disabled {
		return nil
	}
	m, err := e.message(ev)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	ctx, cancel := context.WithTimeout(ctx, e.opts.AckTimeout)
	defer cancel()
	if _, err := e.js.PublishMsg(ctx, m); err != nil {
		e.fail()
		return fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	e.sent.Add(1)
	return nil
}

// Flush waits until every asynchronous event has been acknowledged or ctx ends.
func (e *Emitter) Flush(ctx context.Context) error {
	if e == nil || e.opts.Disabled {
		return nil
	}
	select {
	case <-e.js.PublishAsyncComplete():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
