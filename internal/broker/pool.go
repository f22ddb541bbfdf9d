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

// EnsurePool creates or widens the pool's durable pull consumer of the
// shared exec stream (EnsurePoolOn its Queue).
func (b *Broker) EnsurePool(ctx context.Context, pc PoolConfig) (jetstream.Consumer, error) {
	return b.EnsurePoolOn(ctx, b.SharedQueue(), pc)
}

// EnsurePoolOn creates or widens the pool's durable pull consumer of queue q.
// It never narrows a filter: a worker that starts with a new capability adds
// its subject, and older workers' subjects stay. A capability another pool's
// consumer of q already filters on fails with ErrConfigConflict.
func (b *Broker) EnsurePoolOn(ctx context.Context, q Queue, pc PoolConfig) (jetstream.Consumer, error) {
	name := b.Names.PoolConsumer(pc.Pool)
	// No filter at all, or a wildcard, would make the consumer take requests
	// of every capability in its subject space.
	if len(pc.Capabilities) == 0 {
		return nil, fmt.Errorf("capstan: pool %q: no capabilities", pc.Pool)
	}
	want := make([]string, 0, len(pc.Capabilities))
	for _, id := range pc.Capabilities {
		if err := envelope.ValidCapabilityID(id); err != nil {
			return nil, fmt.Errorf("capstan: pool %q: %w", pc.Pool, err)
		}
		want = append(want, b.Names.QueueFilter(q.Principal, id))
	}
	return b.ensureConsumer(ctx, q, name, want, pc.MaxAckPending, pc.AckWait)
}

// EnsureUnrouted creates the shared exec stream's consumer of requests for
// unknown capabilities (EnsureUnroutedOn its Queue).
func (b *Broker) EnsureUnrouted(ctx context.Context, maxAckPending int, ackWait time.Duration) (jetstream.Consumer, error) {
	return b.EnsureUnroutedOn(ctx, b.SharedQueue(), maxAckPending, ackWait)
}

// EnsureUnroutedOn creates queue q's consumer of requests for unknown
// capabilities.
func (b *Broker) EnsureUnroutedOn(ctx context.Context, q Queue, maxAckPending int, ackWait time.Duration) (jetstream.Consumer, error) {
	return b.ensureConsumer(ctx, q, b.Names.UnroutedConsumer(), []string{b.Names.QueueFilter(q.Principal, Unrouted)}, maxAckPending, ackWait)
}

// poolsKey is the key of q's consumer name in the pools bucket: the name
// alone for the shared exec stream's (as earlier versions kept it), else
// prefixed by the queue's stream.
func poolsKey(q Queue, consumer string) string {
	if q.Principal == "" {
		return consumer
	}
	return q.Name + "." + consumer
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

// Bounds of ensureConsumer. A round that does not settle means another worker
// changed the consumer or its record first; each one makes progress, so only a
// crowd starting at once needs many (32 workers with distinct capabilities take
// up to about 50). Failed rounds are counted apart. A round has its own
// deadline because JetStream answers no info request for a consumer still
// being created.
const (
	maxConsumerRounds    = 1000
	maxConsumerErrors    = 5
	consumerRoundTimeout = 3 * time.Second
)

func (b *Broker) ensureConsumer(ctx context.Context, q Queue, name string, subjects []string, maxAckPending int, ackWait time.Duration) (jetstream.Consumer, error) {
	r := consumerRequest{q: q, name: name, key: poolsKey(q, name), own: sortedCopy(subjects), maxAckPending: maxAckPending, ackWait: ackWait}
	if r.ackWait <= 0 {
		r.ackWait = 30 * time.Second
	}
	if r.maxAckPending <= 0 {
		r.maxAckPending = 1000
	}
	errs := 0
	var lastErr error
	for range maxConsumerRounds {
		if errs >= maxConsumerErrors {
			break
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		// A request JetStream drops (a consumer between leaders answers nothing)
		// costs one round, not the caller's whole deadline.
		rctx, cancel := context.WithTimeout(ctx, consumerRoundTimeout)
		c, done, err := b.consumerRound(rctx, &r)
		cancel()
		switch {
		case done:
			return c, err
		case err != nil:
			errs, lastErr = errs+1, err
			if Unreachable(err) {
				// No responders answer at once while a new stream's group
				// elects its leader: give the election a moment.
				select {
				case <-ctx.Done():
					return nil, ctx.Err()
				case <-time.After(time.Duration(errs) * 100 * time.Millisecond):
				}
			}
		}
	}
	if lastErr == nil {
		return nil, fmt.Errorf("capstan: consumer %s on %s (filters %v): not settled after %d rounds",
			name, q.Name, r.own, maxConsumerRounds)
	}
	return nil, fmt.Errorf("capstan: consumer %s on %s (filters %v): %w", name, q.Name, r.own, lastErr)
}

// consumerRequest is what one caller of ensureConsumer asks for.
type consumerRequest struct {
	q             Queue
	name          string
	key           string   // in the pools bucket
	own           []string // sorted
	maxAckPending int
	ackWait       time.Duration
	ackWaitSet    bool // once written, a later worker's AckWait wins without a fight
}

// consumerRound reads the record and the consumer and does one step towards
// both holding r: it creates or rewrites the consumer, or grows the record, or
// (when both already agree) confirms the record it read is the latest. done
// reports a result (c, or a final err); otherwise err is a failed request and
// nil means another worker changed something first.
func (b *Broker) consumerRound(ctx context.Context, r *consumerRequest) (c jetstream.Consumer, done bool, err error) {
	// The record is read before the consumer: a consumer read afterwards that
	// holds all of it holds every subject recorded so far.
	rec, rev, err := Load[consumerRecord](ctx, b.Pools, r.key)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return nil, false, err
	}
	c, err = r.q.Stream.Consumer(ctx, r.name)
	switch {
	case errors.Is(err, jetstream.ErrConsumerNotFound):
		_, err = r.q.Stream.CreateConsumer(ctx, consumerConfig(r.name, r.own, r.maxAckPending, r.ackWait))
		if cerr := overlapConflict(r.name, r.own, err); cerr != nil {
			return nil, true, cerr
		}
		if errors.Is(err, jetstream.ErrConsumerExists) { // a rival's create came first
			return nil, false, nil
		}
		r.ackWaitSet = r.ackWaitSet || err == nil
		return nil, false, err // the next round records it
	case errors.Is(err, jetstream.ErrNotPullConsumer):
		return nil, true, fmt.Errorf("%w: consumer %s on %s: DeliverSubject is set, capstan needs a pull consumer",
			ErrConfigConflict, r.name, r.q.Name)
	case err != nil:
		return nil, false, err
	}
	info := c.CachedInfo()
	if diff := consumerDiff(info.Config); diff != "" {
		return nil, true, fmt.Errorf("%w: consumer %s on %s: %s", ErrConfigConflict, r.name, r.q.Name, diff)
	}

	have := sortedCopy(Filters(info.Config))
	var recorded consumerRecord
	if rec != nil && rec.Created.Equal(info.Created) {
		recorded = *rec
	}
	want := consumerRecord{
		V:             envelope.Version,
		Created:       info.Created,
		Subjects:      union(recorded.Subjects, union(have, r.own)),
		MaxAckPending: max(recorded.MaxAckPending, info.Config.MaxAckPending, r.maxAckPending),
	}
	consumerCurrent := slices.Equal(have, want.Subjects) && info.Config.MaxAckPending == want.MaxAckPending &&
		(r.ackWaitSet || info.Config.AckWait == r.ackWait)
	recordCurrent := rec != nil && rec.Created.Equal(want.Created) && slices.Equal(rec.Subjects, want.Subjects) &&
		rec.MaxAckPending == want.MaxAckPending

	switch {
	case consumerCurrent && recordCurrent:
		// A replica may have answered with an older record. Rewriting it at the
		// revision read proves that revision was still the latest after the
		// consumer was read, so the consumer held all of it.
		_, err := Update(ctx, b.Pools, r.key, rec, rev)
		if errors.Is(err, ErrRevisionMismatch) {
			return nil, false, nil
		}
		return c, err == nil, err
	case !consumerCurrent:
		wait := r.ackWait
		if r.ackWaitSet {
			wait = info.Config.AckWait
		}
		_, err := r.q.Stream.UpdateConsumer(ctx, consumerConfig(r.name, want.Subjects, want.MaxAckPending, wait))
		if cerr := overlapConflict(r.name, want.Subjects, err); cerr != nil {
			return nil, true, cerr
		}
		if errors.Is(err, jetstream.ErrConsumerDoesNotExist) { // deleted just now
			return nil, false, nil
		}
		if err != nil {
			return nil, false, err
		}
		r.ackWaitSet = true
		if recordCurrent {
			return nil, false, nil // read both back
		}
	}
	if rec == nil {
		_, err = Create(ctx, b.Pools, r.key, &want)
	} else {
		_, err = Update(ctx, b.Pools, r.key, &want, rev)
	}
	if errors.Is(err, ErrExists) || errors.Is(err, ErrRevisionMismatch) {
		return nil, false, nil
	}
	return nil, false, err // read both back: another worker may have overwritten the filter just now
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

func union(a, b []string) []string {
	return sortedCopy(append(slices.Clone(a), b...))
}

// Filters returns the subjects consumer c filters on: its FilterSubjects and
// its FilterSubject, in a slice of their own. None: every subject.
func Filters(c jetstream.ConsumerConfig) []string {
	out := slices.Clone(c.FilterSubjects)
	if c.FilterSubject != "" {
		out = append(out, c.FilterSubject)
	}
	return out
}

func sortedCopy(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return slices.Compact(out)
}
