package broker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Backlog is what waits in one pool's consumer of the exec stream.
type Backlog struct {
	// Pool is the pool's name, or Unrouted for the consumer of requests no
	// pool's filter names.
	Pool string
	// Pending counts requests stored and not yet delivered to a worker.
	Pending uint64
	// AckPending counts requests delivered and not yet acknowledged: running,
	// or buffered in a worker.
	AckPending int
	// Oldest is when the oldest request not yet acknowledged was stored; zero
	// when there is none.
	Oldest time.Time
}

// Backlogs reads every pool consumer's backlog. The exec stream is a work
// queue, so the first stored message a consumer's filter matches (at or after
// its ack floor) is the oldest request it has not finished.
func (b *Broker) Backlogs(ctx context.Context) ([]Backlog, error) {
	var out []Backlog
	l := b.Exec.ListConsumers(ctx)
	for info := range l.Info() {
		pool, ok := strings.CutPrefix(info.Name, "pool-")
		if !ok && info.Name != Unrouted {
			continue // not one of capstan's
		}
		if !ok {
			pool = Unrouted
		}
		bl := Backlog{Pool: pool, Pending: info.NumPending, AckPending: info.NumAckPending}
		if info.NumPending > 0 || info.NumAckPending > 0 {
			oldest, err := b.oldest(ctx, info)
			if err != nil {
				return nil, err
			}
			bl.Oldest = oldest
		}
		out = append(out, bl)
	}
	if err := l.Err(); err != nil {
		return nil, fmt.Errorf("capstan: list pool consumers: %w", err)
	}
	return out, nil
}

func (b *Broker) oldest(ctx context.Context, info *jetstream.ConsumerInfo) (time.Time, error) {
	var oldest time.Time
	for _, subject := range Filters(info.Config) {
		m, err := b.Exec.GetMsg(ctx, info.AckFloor.Stream+1, jetstream.WithGetMsgSubject(subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return time.Time{}, fmt.Errorf("capstan: oldest request of %s: %w", info.Name, err)
		}
		if oldest.IsZero() || m.Time.Before(oldest) {
			oldest = m.Time
		}
	}
	return oldest, nil
}
