package audit

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/broker"
)

// Filter selects events; an empty field matches every event.
type Filter struct {
	// Principal keeps the events of one principal's executions. With
	// ExecutionID, the anonymous principal's when empty.
	Principal string
	// ExecutionID narrows the stream's subject to one execution's trail:
	// Principal's execution of that id.
	ExecutionID string
	// CapabilityID, ActorID and Type are not in the subject; they are matched
	// on each event.
	CapabilityID string
	ActorID      string // the actor's id, of any kind
	Type         string // an event type (EventRequested, EventFailed, …)
}

// Match reports whether ev passes the filter.
func (f Filter) Match(ev *Event) bool {
	return (f.Principal == "" && f.ExecutionID == "" || ev.principal() == f.principal()) &&
		(f.ExecutionID == "" || ev.ExecutionID == f.ExecutionID) &&
		(f.CapabilityID == "" || ev.CapabilityID == f.CapabilityID) &&
		(f.ActorID == "" || ev.Actor.ID == f.ActorID) &&
		(f.Type == "" || ev.Type == f.Type)
}

// principal is the filter's principal: the anonymous one when it names an
// execution without a principal.
func (f Filter) principal() string {
	if f.Principal == "" {
		return broker.Anonymous
	}
	return f.Principal
}

// FollowOption says where following starts. By default it starts with the
// first event stored after Follow is called.
type FollowOption func(*followFrom)

// followSlack is how far ahead of the server's clock the clock that made an
// execution id may be for Follow from the id's time to see its first event.
const followSlack = time.Minute

type followFrom struct {
	cfg jetstream.OrderedConsumerConfig
	// fromStart: with an execution id, from the id's time (see Follow).
	fromStart bool
	// Events of the message at stream sequence skipSeq up to and including
	// index skipIndex were seen already.
	skipSeq   uint64
	skipIndex int
}

func (f *followFrom) set(p jetstream.DeliverPolicy, seq uint64, t *time.Time) {
	f.cfg.DeliverPolicy, f.cfg.OptStartSeq, f.cfg.OptStartTime = p, seq, t
	f.fromStart, f.skipSeq, f.skipIndex = false, 0, 0
}

// FromStart follows from the oldest event the stream still keeps. With
// Filter.ExecutionID set, from the oldest event of the execution's shard that
// can belong to it: from a minute before the time in its id (a client's clock
// may be ahead of the server's by that much), or from the stream's start for
// an id that is not a UUIDv7.
func FromStart() FollowOption {
	return func(f *followFrom) {
		f.set(jetstream.DeliverAllPolicy, 0, nil)
		f.fromStart = true
	}
}

// Since follows from the first event stored at or after t.
func Since(t time.Time) FollowOption {
	return func(f *followFrom) { f.set(jetstream.DeliverByStartTimePolicy, 0, &t) }
}

// FromSeq follows from the message at stream sequence seq, all of its
// events included; pass Event.Seq+1 of the last event seen to resume after
// its message, or use After.
func FromSeq(seq uint64) FollowOption {
	return func(f *followFrom) {
		if seq == 0 {
			seq = 1
		}
		f.set(jetstream.DeliverByStartSequencePolicy, seq, nil)
	}
}

// After resumes exactly after ev, an event Follow or Read returned: with the
// events stored after it in ev's own message (see Decode), then the
// messages after that one.
func After(ev Event) FollowOption {
	return func(f *followFrom) {
		FromSeq(ev.Seq)(f)
		f.skipSeq, f.skipIndex = ev.Seq, ev.Index
	}
}

// Follow calls fn with every event that passes f, in stream order (and, in a
// message of several events, in their order), as the stream stores them. It
// returns nil when ctx ends, or the first error fn returns. A message that
// does not decode ends it with an error naming its sequence.
//
// With Filter.ExecutionID, Follow reads the execution's shard (see
// broker.AuditShard) and keeps the execution's events by their
// Capstan-Execution header, and also the shard and the subject stores of
// earlier versions kept the execution's events on.
//
// Follow reads through one ephemeral ordered consumer and deletes it on return.
func Follow(ctx context.Context, nc *nats.Conn, prefix string, f Filter, fn func(Event) error, opts ...FollowOption) error {
	n := broker.NewNames(prefix)
	subjects := []string{n.AuditSubjects()}
	if f.ExecutionID != "" {
		if err := envelope.ValidExecutionID(f.ExecutionID); err != nil {
			return fmt.Errorf("capstan: %w", err)
		}
		if f.Principal != "" && !broker.ValidPrincipal(f.Principal) {
			return fmt.Errorf("capstan: %q is not a principal", f.Principal)
		}
		subjects = trailSubjects(n, f.principal(), f.ExecutionID)
	}
	from := followFrom{cfg: jetstream.OrderedConsumerConfig{FilterSubjects: subjects, DeliverPolicy: jetstream.DeliverNewPolicy}}
	for _, o := range opts {
		o(&from)
	}
	if from.fromStart && f.ExecutionID != "" {
		if t, ok := idTime(f.ExecutionID); ok {
			t = t.Add(-followSlack)
			from.cfg.DeliverPolicy, from.cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &t
		}
	}
	subject := subjects[0]
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	cons, err := js.OrderedConsumer(ctx, n.AuditStream(), from.cfg)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("capstan: follow %s: %w", subject, err)
	}
	defer deleteConsumer(nc, js, n.AuditStream(), cons)
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("capstan: follow %s: %w", subject, err)
	}
	defer it.Stop()
	for {
		m, err := it.Next(jetstream.NextContext(ctx))
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return fmt.Errorf("capstan: follow %s: %w", subject, err)
		}
		var seq uint64
		if meta, err := m.Metadata(); err == nil {
			seq = meta.Sequence.Stream
		}
		if f.ExecutionID != "" && !ofExecution(m.Headers(), broker.Key(f.principal(), f.ExecutionID), f.ExecutionID) {
			continue
		}
		evs, err := Decode(m.Data())
		if err != nil {
			return fmt.Errorf("%w (stream %s, sequence %d)", err, n.AuditStream(), seq)
		}
		for i := range evs {
			ev := &evs[i]
			ev.Seq = seq
			if seq == from.skipSeq && ev.Index <= from.skipIndex {
				continue
			}
			if !f.Match(ev) {
				continue
			}
			if err := fn(*ev); err != nil {
				return err
			}
		}
	}
}

// trailSubjects are the subjects principal's execution executionID's events
// can be on: the shard of its key, and, for stores of earlier versions, the
// shard of its id alone and the one subject per execution of stores written
// before the shards.
func trailSubjects(n broker.Names, principal, executionID string) []string {
	subjects := []string{n.AuditSubject(broker.Key(principal, executionID))}
	for _, s := range []string{n.AuditSubject(executionID), n.LegacyAuditSubject(executionID)} {
		if !slices.Contains(subjects, s) {
			subjects = append(subjects, s)
		}
	}
	return subjects
}

// ofExecution reports whether a message's header may name the execution of
// key (broker.Key) and id: its Capstan-Execution header, or in a message of
// an earlier version the Capstan-Execution-Id header, names it; a message
// with neither (older still) is decided by its events, which Filter.Match
// and Read check.
func ofExecution(h nats.Header, key, id string) bool {
	if v := h.Get(broker.AuditExecutionHeader); v != "" {
		return v == key
	}
	v := h.Get(broker.LegacyAuditExecutionHeader)
	return v == "" || v == id
}

// deleteConsumer removes the ordered consumer now rather than when the server
// notices it is inactive. Its name changes when it is reset after a gap, so
// the current one is asked for at the end.
func deleteConsumer(nc *nats.Conn, js jetstream.JetStream, stream string, cons jetstream.Consumer) {
	info := cons.CachedInfo()
	if info == nil || !nc.IsConnected() {
		return // a server out of reach would hold the caller up to the timeout
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// On failure the server still removes it after its inactivity threshold.
	_ = js.DeleteConsumer(ctx, stream, info.Name)
}
