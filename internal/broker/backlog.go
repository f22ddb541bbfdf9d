package broker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Backlog is what waits for one pool, in every queue.
type Backlog struct {
	// Pool is the pool's name, or Unrouted for the consumers of requests no
	// pool's filter names.
	Pool string
	// Pending counts requests stored and not yet delivered to a worker.
	Pending uint64
	// AckPending counts requests delivered and not yet acknowledged: running,
	// or buffered in a worker.
	AckPending int
	// Redelivered counts requests delivered more than once and not yet
	// acknowledged.
	Redelivered int
	// Waiting counts the pull requests the pool's workers have outstanding.
	Waiting int
	// Oldest is when the oldest request not yet acknowledged was stored; zero
	// when there is none.
	Oldest time.Time
}

// Backlogs reads every pool's backlog: the sum of its consumers of every
// queue (DESIGN §3), its oldest request the oldest of theirs. A queue is a
// work queue, so the first stored message a consumer's filter matches (at or
// after its ack floor) is the oldest request it has not finished.
func (b *Broker) Backlogs(ctx context.Context) ([]Backlog, error) {
	queues, err := b.Queues(ctx)
	if err != nil {
		return nil, err
	}
	byPool := map[string]*Backlog{}
	var order []string
	for _, q := range queues {
		l := q.Stream.ListConsumers(ctx)
		for info := range l.Info() {
			pool, ok := strings.CutPrefix(info.Name, "pool-")
			if !ok && info.Name != Unrouted {
				continue // not one of capstan's
			}
			if !ok {
				pool = Unrouted
			}
			bl := byPool[pool]
			if bl == nil {
				bl = &Backlog{Pool: pool}
				byPool[pool] = bl
				order = append(order, pool)
			}
			bl.Pending += info.NumPending
			bl.AckPending += info.NumAckPending
			bl.Redelivered += info.NumRedelivered
			bl.Waiting += info.NumWaiting
			if info.NumPending > 0 || info.NumAckPending > 0 {
				oldest, err := oldest(ctx, q, info)
				if err != nil {
					return nil, err
				}
				if !oldest.IsZero() && (bl.Oldest.IsZero() || oldest.Before(bl.Oldest)) {
					bl.Oldest = oldest
				}
			}
		}
		if err := l.Err(); err != nil {
			return nil, fmt.Errorf("capstan: list the consumers of %s: %w", q.Name, err)
		}
	}
	out := make([]Backlog, 0, len(order))
	for _, pool := range order {
		out = append(out, *byPool[pool])
	}
	return out, nil
}

func oldest(ctx context.Context, q Queue, info *jetstream.ConsumerInfo) (time.Time, error) {
	var oldest time.Time
	for _, subject := range Filters(info.Config) {
		m, err := q.Stream.GetMsg(ctx, info.AckFloor.Stream+1, jetstream.WithGetMsgSubject(subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return time.Time{}, fmt.Errorf("capstan: oldest request of %s on %s: %w", info.Name, q.Name, err)
		}
		if oldest.IsZero() || m.Time.Before(oldest) {
			oldest = m.Time
		}
	}
	return oldest, nil
}

// QueueUsages reads what every principal's queue holds and may hold, the
// shared exec stream's as the anonymous principal's.
func (b *Broker) QueueUsages(ctx context.Context) ([]QueueUsage, error) {
	queues, err := b.Queues(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]QueueUsage, 0, len(queues))
	for _, q := range queues {
		p := q.Principal
		if p == "" {
			p = Anonymous
		}
		// Queues read the streams just now.
		out = append(out, usageOf(p, q.Stream.CachedInfo()))
	}
	return out, nil
}
