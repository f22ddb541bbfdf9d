package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/capstan-dev/capstan/internal/testhooks"

	"github.com/capstan-dev/capstan/demo"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// rig is the client and the in-process workers one run uses.
type rig struct {
	url    string
	srv    *server.Server // nil unless embedded
	client *executor.Client
	b      *broker.Broker
	nc     *nats.Conn
	// adminJS administers streams: the baseline's, the consumer count.
	adminJS jetstream.JetStream
	closers []func()
	// conns are every connection the run opened; an interrupted run closes
	// them before anything else (see close).
	conns []*nats.Conn
	// abandon, set by an interrupted close, makes stopping the in-process
	// workers not wait for their drain.
	abandon atomic.Bool
	// startWorkers starts the in-process workers, waits until the catalog
	// lists what they serve, and returns what stops them.
	startWorkers func(ctx context.Context) (stop func(), err error)
}

// close releases what the run holds. When ctx has ended (a signal, the
// run's timeout) the server may be gone, and everything that talks to it on
// the way out — a consumer deleted, a worker's drain writing records — would
// wait for it: close then shuts every connection first and abandons the
// in-process workers, as a crash of this process would (the design's
// takeover covers their executions), so that the process stops promptly.
func (r *rig) close(ctx context.Context) {
	if ctx.Err() != nil {
		r.abandon.Store(true)
		for _, nc := range r.conns {
			nc.Close()
		}
	}
	for i := len(r.closers) - 1; i >= 0; i-- {
		r.closers[i]()
	}
}

// newRig connects the client, provisions the demo capabilities' resources
// and prepares the workers, each on its own connection.
func newRig(ctx context.Context, t Target, cfg *Config) (*rig, error) {
	r := &rig{srv: t.Server}
	nc, err := t.Connect("client")
	if err != nil {
		return nil, err
	}
	r.closers = append(r.closers, nc.Close)
	r.conns = append(r.conns, nc)
	r.url = nc.ConnectedUrlRedacted()
	r.nc = nc
	admin, err := t.Connect("admin")
	if err != nil {
		r.close(ctx)
		return nil, err
	}
	r.closers = append(r.closers, admin.Close)
	r.conns = append(r.conns, admin)
	js, err := demo.Provision(ctx, admin, 0) // auto: what exists, or the deployment's choice
	if err != nil {
		r.close(ctx)
		return nil, err
	}
	r.adminJS = js
	r.client, err = executor.NewClient(nc, executor.ClientConfig{Actor: envelope.Actor{Kind: envelope.ActorService, ID: "capstan-bench"}})
	if err != nil {
		r.close(ctx)
		return nil, err
	}
	r.closers = append(r.closers, func() { _ = r.client.Close() })
	r.b = testhooks.Broker(r.client)
	r.startWorkers = func(ctx context.Context) (func(), error) { return r.runWorkers(ctx, t, cfg, js) }
	return r, nil
}

func (r *rig) runWorkers(ctx context.Context, t Target, cfg *Config, js jetstream.JetStream) (func(), error) {
	// The workers outlive the call (a backlog starts them, the run ends
	// them): their context is not ctx.
	wctx, stop := context.WithCancel(context.Background())
	var running sync.WaitGroup
	stopAll := func() {
		stop()
		if !r.abandon.Load() {
			running.Wait()
		}
	}
	var served []string
	for i := 0; i < cfg.Workers; i++ {
		wnc, err := t.Connect(fmt.Sprintf("worker %d", i))
		if err != nil {
			stopAll()
			return nil, err
		}
		r.conns = append(r.conns, wnc)
		reg, err := executor.NewRegistry(append(demo.Catalog(js), readCapability())...)
		if err == nil {
			served = reg.IDs()
			var w *executor.Worker
			w, err = executor.NewWorker(wnc, reg, testhooks.Worker(executor.WorkerConfig{Pool: "default", Concurrency: cfg.WorkerConcurrency,
				Grace: 5 * time.Second}, testhooks.WorkerKnobs{DisableAudit: cfg.NoAudit, AuditUnacknowledged: cfg.AuditUnacked}))
			if err == nil {
				running.Add(1)
				go func() {
					defer running.Done()
					defer wnc.Close()
					if err := w.Run(wctx); err != nil {
						fmt.Fprintf(cfg.Notes, "capstan bench: worker: %v\n", err)
					}
				}()
			}
		}
		if err != nil {
			wnc.Close()
			stopAll()
			return nil, err
		}
	}
	if err := waitListed(ctx, r.b.Catalog, served); err != nil {
		stopAll()
		return nil, err
	}
	r.closers = append(r.closers, stopAll)
	return stopAll, nil
}

// waitListed waits until the catalog lists every id: workers write their
// entries once they serve.
func waitListed(ctx context.Context, catalog jetstream.KeyValue, ids []string) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for _, id := range ids {
		for {
			if _, err := catalog.Get(ctx, id); err == nil {
				break
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-tick.C:
			}
		}
	}
	return nil
}

// serverMsgs counts the messages the embedded server received and sent; 0
// without one.
func (r *rig) serverMsgs() int64 {
	if r.srv == nil {
		return 0
	}
	v, err := r.srv.Varz(nil)
	if err != nil {
		return 0
	}
	return v.InMsgs + v.OutMsgs
}

// readCapability is demo.echo as a read declared Idempotent, which runs
// without a claim (DESIGN §14, "Reads without claims"): --capability
// bench.read measures that path.
func readCapability() executor.Capability {
	return executor.Define("bench.read", executor.Meta{
		Description: "Returns its input unchanged, as a read that runs without a claim.",
		Expose:      executor.On(executor.SurfaceDirect), SideEffect: executor.SideEffectRead, Idempotent: true,
	}, func(ctx context.Context, c executor.Call[map[string]any]) (map[string]any, error) {
		return c.Input, nil
	})
}
