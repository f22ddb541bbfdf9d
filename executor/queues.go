package executor

import (
	"context"
	"time"

	"github.com/capstan-dev/capstan/executor/internal/engine"
	"github.com/capstan-dev/capstan/internal/broker"
)

// queueScan is how often a worker looks for queues it does not pull from
// yet (a principal added, DESIGN §3), besides every change of the grants.
const queueScan = 5 * time.Second

// openQueue makes q's consumers of the worker's pool and of unrouted
// requests, as the engine pulls them.
func (w *Worker) openQueue(ctx context.Context, q broker.Queue) (engine.Queue, error) {
	pool, err := w.b.EnsurePoolOn(ctx, q, broker.PoolConfig{
		Pool: w.cfg.Pool, Capabilities: w.reg.ids, MaxAckPending: poolMaxAckPending(w.cfg.Concurrency), AckWait: w.cfg.Lease,
	})
	if err != nil {
		return engine.Queue{}, err
	}
	unrouted, err := w.b.EnsureUnroutedOn(ctx, q, 1000, w.cfg.Lease)
	if err != nil {
		return engine.Queue{}, err
	}
	return engine.Queue{Name: q.Name, Principal: q.Principal, Pool: pool, Unrouted: unrouted}, nil
}

// openQueues makes the consumers of every queue there is now: the shared
// exec stream's must succeed; a principal's queue that fails is logged and
// left to watchQueues.
func (w *Worker) openQueues(ctx context.Context) ([]engine.Queue, error) {
	queues, err := w.b.Queues(ctx)
	if err != nil {
		return nil, err
	}
	var out []engine.Queue
	shared := false
	for _, q := range queues {
		eq, err := w.openQueue(ctx, q)
		if err != nil {
			if q.Principal == "" || broker.Unreachable(err) {
				return nil, err
			}
			w.log.Warn("queue not pulled yet; tried again later", "queue", q.Name, "err", err)
			continue
		}
		shared = shared || q.Principal == ""
		out = append(out, eq)
	}
	if !shared {
		// Listed before it was provisioned, or not listable: the shared
		// stream is the one every worker pulls.
		eq, err := w.openQueue(ctx, w.b.SharedQueue())
		if err != nil {
			return nil, err
		}
		out = append([]engine.Queue{eq}, out...)
	}
	return out, nil
}

// watchQueues sends on more every queue the engine does not pull from, as
// it appears (a principal added and pushed), until ctx ends: it looks at
// every change of the grants and every queueScan.
func (w *Worker) watchQueues(ctx context.Context, more chan<- engine.Queue) {
	tick := time.NewTicker(queueScan)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-w.grants.Changed():
		}
		w.findQueues(ctx, more)
	}
}

// findQueues opens the queues the engine does not pull from.
func (w *Worker) findQueues(ctx context.Context, more chan<- engine.Queue) {
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	names, err := w.b.QueueNames(lctx)
	if err != nil {
		if ctx.Err() == nil {
			w.log.Warn("queues not listed", "err", err)
		}
		return
	}
	for _, name := range names {
		if w.run.Pulling(name) {
			continue
		}
		q, ok, err := w.b.QueueNamed(lctx, name)
		if err == nil && ok {
			var eq engine.Queue
			if eq, err = w.openQueue(lctx, q); err == nil {
				select {
				case more <- eq:
				case <-ctx.Done():
					return
				}
				continue
			}
		}
		if err != nil && ctx.Err() == nil {
			w.log.Warn("queue not pulled yet; tried again later", "queue", name, "err", err)
		}
	}
}
