package executor

import (
	"context"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/execrpc"
	"github.com/capstan-dev/capstan/internal/testhooks"
)

func init() {
	testhooks.ClientBroker = func(c any) *broker.Broker { return c.(*Client).b }
	testhooks.WorkerKnobsOf = func(cfg any) *testhooks.WorkerKnobs { return &cfg.(*WorkerConfig).knobs }
	execrpc.ListWithQueued = func(ctx context.Context, b *broker.Broker, q audit.Query, first bool) ([]audit.Entry, int, string, error) {
		page, err := listWithQueued(ctx, b, q, first, ScopeAll, current(b))
		if err != nil {
			return nil, 0, "", err
		}
		return page.Entries, page.Scanned, page.Next, nil
	}
}
