package broker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/envelope"
)

// PoolConfig describes one pool's durable consumer.
type PoolConfig struct {
	// Pool is the pool's name; the consumer is "pool-<name>".
	Pool string
	// Capabilities the calling worker serves; the consumer's filter becomes the
	// union of these and the filters it already has.
	Capabilities []string
	// MaxAckPending is at least the pool's concurrency (default 1000). It only
	// grows: the consumer keeps the largest any worker asked for.
	MaxAckPending int
	// AckWait is how long a delivery stays unacknowledged before JetStream
	// redelivers it; workers renew it with InProgress. Default 30 s. The
	// latest worker to start sets it.
	AckWait time.Duration
}

// EnsurePool creates or widens the pool's durable pull consumer. It never
// narrows a filter: a worker that starts with a new capability adds its subject,
// and older workers' subjects stay. A capability another pool's consumer
// already filters on fails with ErrConfigConflict.
func (b *Broker) EnsurePool(ctx context.Context, pc PoolConfig) (jetstream.Consumer, error) {
	name := b.Names.PoolConsumer(pc.Pool)
	want := make([]string, 0, len(pc.Capabilities))
	for _, id := range pc.Capabilities {
		want = append(want, b.Names.ExecSubject(id))
	}
	return b.ensureConsumer(ctx, name, want, pc.MaxAckPending, pc.AckWait)
}

// EnsureUnrouted creates the consumer of requests for unknown capabilities.
func (b *Broker) EnsureUnrouted(ctx context.Context, maxAckPending int, ackWait time.Duration) (jetstream.Consumer, error) {
	return b.ensureConsumer(ctx, b.Names.UnroutedConsumer(), []string{b.Names.UnroutedSubject()}, maxAckPending, ackWait)
}

// consumerRecord is what every worker of a pool has asked of its consumer, kept
// in the pools bucket and grown only by compare-and-swap. JetStream updates a
// consumer without a revision check, so two workers widening it at once can
// overwrite each other's filter; each keeps rewriting the consumer until it
// matches the record, and the record never loses a subject.
type consumerRecord struct {
	V int `json:"v"`
	// Created is the consumer's creation time: a record of a consumer that was
	// deleted and made again describes the old one and is ignored.
	Created       time.Time `json:"created"`
	Subjects      []string  `json:"subjects"`
	MaxAckPending int       `json:"maxAckPending"`
}

// Bounds of ensureConsumer: rounds lost to other workers changing the
// consumer or its record at the same moment, and failed requests.
const (
	maxConsumerRounds = 100
	maxConsumerErrors = 5
)

func (b *Broker) ensureConsumer(ctx context.Context, name string, subjects []string, maxAckPending int, ackWait time.Duration) (jetstream.Consumer, error) {
	if ackWait <= 0 {
		ackWait = 30 * time.Second
	}
	if maxAckPending <= 0 {
		maxAckPending = 1000
	}
	own := sortedCopy(subjects)
	ackWaitSet := false // once written, a later worker's AckWait wins without a fight
	errs := 0
	var lastErr error
	for range maxConsumerRounds {
		if errs >= maxConsumerErrors {
			break
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		// The record is read before the consumer: a consumer read afterwards that
		// holds all of it holds every subject recorded so far.
		rec, rev, err := Load[consumerRecord](ctx, b.Pools, name)
		if err != nil && !errors.Is(err, ErrNotFound) {
			errs, lastErr = errs+1, err
			continue
		}
		c, err := b.Exec.Consumer(ctx, name)
		switch {
		case errors.Is(err, jetstream.ErrConsumerNotFound):
			_, err = b.Exec.CreateConsumer(ctx, consumerConfig(name, own, maxAckPending, ackWait))
			if cerr := overlapConflict(name, own, err); cerr != nil {
				return nil, cerr
			}
			switch {
			case err == nil:
				ackWaitSet = true // the next round records it
			case !errors.Is(err, jetstream.ErrConsumerExists): // not a rival's create
				errs, lastErr = errs+1, err
			}
			continue
		case errors.Is(err, jetstream.ErrNotPullConsumer):
			return nil, fmt.Errorf("%w: consumer %s on %s: DeliverSubject is set, capstan needs a pull consumer",
				ErrConfigConflict, name, b.Names.ExecStream())
		case err != nil:
			errs, lastErr = errs+1, err
			continue
		}
		info := c.CachedInfo()
		if diff := consumerDiff(info.Config); diff != "" {
			return nil, fmt.Errorf("%w: consumer %s on %s: %s", ErrConfigConflict, name, b.Names.ExecStream(), diff)
		}

		have := union(info.Config.FilterSubjects, info.Config.FilterSubject, nil)
		var recorded consumerRecord
		if rec != nil && rec.Created.Equal(info.Created) {
			recorded = *rec
		}
		want := consumerRecord{
			V:             envelope.Version,
			Created:       info.Created,
			Subjects:      union(recorded.Subjects, "", union(have, "", own)),
			MaxAckPending: max(recorded.MaxAckPending, info.Config.MaxAckPending, maxAckPending),
		}
		consumerCurrent := slices.Equal(have, want.Subjects) && info.Config.MaxAckPending == want.MaxAckPending &&
			(ackWaitSet || info.Config.AckWait == ackWait)
		recordCurrent := rec != nil && rec.Created.Equal(want.Created) && slices.Equal(rec.Subjects, want.Subjects) &&
			rec.MaxAckPending == want.MaxAckPending
		if consumerCurrent && recordCurrent {
			return c, nil
		}

		if !consumerCurrent {
			wait := ackWait
			if ackWaitSet {
				wait = info.Config.AckWait
			}
			_, err := b.Exec.UpdateConsumer(ctx, consumerConfig(name, want.Subjects, want.MaxAckPending, wait))
			if cerr := overlapConflict(name, want.Subjects, err); cerr != nil {
				return nil, cerr
			}
			if err != nil {
				if !errors.Is(err, jetstream.ErrConsumerDoesNotExist) { // not a deletion just now
					errs, lastErr = errs+1, err
				}
				continue
			}
			ackWaitSet = true
		}
		if !recordCurrent {
			if rec == nil {
				_, err = Create(ctx, b.Pools, name, &want)
			} else {
				_, err = Update(ctx, b.Pools, name, &want, rev)
			}
			if err != nil && !errors.Is(err, ErrExists) && !errors.Is(err, ErrRevisionMismatch) {
				errs, lastErr = errs+1, err
			}
		}
		// Read both back: another worker may have overwritten the filter just now.
	}
	if lastErr == nil {
		return nil, fmt.Errorf("capstan: consumer %s on %s (filters %v): not settled after %d rounds",
			name, b.Names.ExecStream(), own, maxConsumerRounds)
	}
	return nil, fmt.Errorf("capstan: consumer %s on %s (filters %v): %w", name, b.Names.ExecStream(), own, lastErr)
}

func consumerConfig(name string, subjects []string, maxAckPending int, ackWait time.Duration) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:        name,
		AckPolicy:      jetstream.AckExplicitPolicy,
		DeliverPolicy:  jetstream.DeliverAllPolicy,
		MaxDeliver:     -1,
		AckWait:        ackWait,
		MaxAckPending:  maxAckPending,
		FilterSubjects: subjects,
	}
}

// consumerDiff names the fields of an existing consumer that capstan relies on
// and does not overwrite. (A work-queue stream itself refuses consumers that
// do not ack explicitly or do not deliver everything.)
func consumerDiff(have jetstream.ConsumerConfig) string {
	// A request past MaxDeliver would sit in the stream forever with no envelope.
	if have.MaxDeliver != -1 {
		return fmt.Sprintf("MaxDeliver is %d, capstan needs -1", have.MaxDeliver)
	}
	return ""
}

// overlapConflict turns the server's refusal of overlapping filters on a
// work-queue stream into ErrConfigConflict; any other error gives nil.
func overlapConflict(name string, filters []string, err error) error {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.ErrorCode == 10100 { // filtered consumer not unique on work-queue stream
		return fmt.Errorf("%w: consumer %s: its filters %v overlap another pool's; a capability is served by one pool only",
			ErrConfigConflict, name, filters)
	}
	return nil
}

func union(a []string, one string, b []string) []string {
	out := slices.Clone(a)
	if one != "" {
		out = append(out, one)
	}
	out = append(out, b...)
	return sortedCopy(out)
}

func sortedCopy(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return slices.Compact(out)
}
