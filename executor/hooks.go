package executor

import (
	"context"
	"time"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/execrpc"
	"github.com/capstan-dev/capstan/internal/testhooks"
)

func init() {
	testhooks.ClientBroker = func(c any) *broker.Broker { return c.(*Client).b }
	testhooks.WorkerKnobsOf = func(cfg any) *testhooks.WorkerKnobs { return &cfg.(*WorkerConfig).knobs }
	execrpc.ListWithQueued = func(ctx context.Context, b *broker.Broker, q audit.Query, first bool) ([]audit.Entry, int, string, error) {
		// As the deployment recorded it: a broker that did not provision
		// holds the default (0 when unread: no entry is judged by it).
		retention := func(ctx context.Context) time.Duration {
			r, _ := b.EnvelopeRetention(ctx)
			return r
		}
		page, err := listWithQueued(ctx, b, q, first, ScopeAll, current(b, retention))
		if err != nil {
			return nil, 0, "", err
		}
		return page.Entries, page.Scanned, page.Next, nil
	}
}
