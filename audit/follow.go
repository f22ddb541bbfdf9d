package audit

import (
	"context"
	"fmt"
	"time"

	"github.com/capstan-dev/capstan/broker"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/nats-io/nats.go/jetstream"
)

// Filter selects events; an empty field matches every event.
type Filter struct {
	// ExecutionID narrows the stream's subject to one execution's trail.
	ExecutionID string
	// CapabilityID, ActorID and Type are not in the subject; they are matched
	// on each event.
	CapabilityID string
	ActorID      string
	Type         string
}

// Match reports whether ev passes the filter.
func (f Filter) Match(ev *Event) bool {
	return (f.ExecutionID == "" || ev.ExecutionID == f.ExecutionID) &&
		(f.CapabilityID == "" || ev.CapabilityID == f.CapabilityID) &&
		(f.ActorID == "" || ev.Actor.ID == f.ActorID) &&
		(f.Type == "" || ev.Type == f.Type)
}

// FollowOption says where following starts. By default it starts with the
// first event stored after Follow is called.
type FollowOption func(*jetstream.OrderedConsumerConfig)

// FromStart follows from the oldest event the stream still keeps.
func FromStart() FollowOption {
	return func(c *jetstream.OrderedConsumerConfig) {
		c.DeliverPolicy, c.OptStartSeq, c.OptStartTime = jetstream.DeliverAllPolicy, 0, nil
	}
}

// Since follows from the first event stored at or after t.
func Since(t time.Time) FollowOption {
	return func(c *jetstream.OrderedConsumerConfig) {
		t := t
		c.DeliverPolicy, c.OptStartSeq, c.OptStartTime = jetstream.DeliverByStartTimePolicy, 0, &t
	}
}

// FromSeq follows from the event at stream sequence seq; pass Event.Seq+1 of
// the last event seen to resume after it.
func FromSeq(seq uint64) FollowOption {
	return func(c *jetstream.OrderedConsumerConfig) {
		if seq == 0 {
			seq = 1
		}
		c.DeliverPolicy, c.OptStartSeq, c.OptStartTime = jetstream.DeliverByStartSequencePolicy, seq, nil
	}
}

// Follow calls fn with every event that passes f, in stream order, as the
// stream stores them. It returns nil when ctx ends, or the first error fn
// returns. An event that does not decode ends it with an error naming its
// sequence.
//
// Follow reads through one ephemeral ordered consumer and deletes it on return.
func Follow(ctx context.Context, b *broker.Broker, f Filter, fn func(Event) error, opts ...FollowOption) error {
	subject := b.Names.AuditSubjects()
	if f.ExecutionID != "" {
		if err := envelope.ValidExecutionID(f.ExecutionID); err != nil {
			return fmt.Errorf("capstan: %w", err)
		}
		subject = b.Names.AuditSubject(f.ExecutionID)
	}
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}, DeliverPolicy: jetstream.DeliverNewPolicy}
	for _, o := range opts {
		o(&cfg)
	}
	cons, err := b.Audit.OrderedConsumer(ctx, cfg)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("capstan: follow %s: %w", subject, err)
	}
	defer deleteConsumer(b, cons)
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
		ev, err := Decode(m.Data())
		if err != nil {
			meta, _ := m.Metadata()
			if meta != nil {
				return fmt.Errorf("%w (stream %s, sequence %d)", err, b.Names.AuditStream(), meta.Sequence.Stream)
			}
			return err
		}
		if meta, err := m.Metadata(); err == nil {
			ev.Seq = meta.Sequence.Stream
		}
		if !f.Match(ev) {
			continue
		}
		if err := fn(*ev); err != nil {
			return err
		}
	}
}

// deleteConsumer removes the ordered consumer now rather than when the server
// notices it is inactive. Its name changes when it is reset after a gap, so
// the current one is asked for at the end.
func deleteConsumer(b *broker.Broker, cons jetstream.Consumer) {
	info := cons.CachedInfo()
	if info == nil || !b.NC.IsConnected() {
		return // a server out of reach would hold the caller up to the timeout
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// On failure the server still removes it after its inactivity threshold.
	_ = b.Audit.DeleteConsumer(ctx, info.Name)
}
