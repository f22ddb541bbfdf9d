package broker

import (
	"context"
	"fmt"
	"time"
)

// ClockOffset measures the clock now reads against the NATS server's: the
// time the server says it gathered the executions bucket's stream
// information, less the middle of the request's round trip as now read it.
// offset is positive when the server's clock is ahead of now's; the true
// offset lies within margin (half the round trip) of it.
func (b *Broker) ClockOffset(ctx context.Context, now func() time.Time) (offset, margin time.Duration, err error) {
	sent := now()
	s, err := b.JS.Stream(ctx, "KV_"+b.Names.ExecutionsBucket())
	if err != nil {
		return 0, 0, fmt.Errorf("capstan: read the server's time: %w", err)
	}
	back := now()
	ts := s.CachedInfo().TimeStamp
	if ts.IsZero() {
		return 0, 0, fmt.Errorf("capstan: read the server's time: the server does not say it")
	}
	margin = back.Sub(sent) / 2
	return ts.Sub(sent.Add(margin)), margin, nil
}
