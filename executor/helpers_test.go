package executor_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/internal/testhooks"

	"github.com/capstan-dev/capstan/capstantest"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/nats-io/nats.go"
)

type echoIn struct {
	Hello string `json:"hello"`
}

var alice = envelope.Actor{Kind: "user", ID: "alice"}

func echoCap(calls *atomic.Int64) executor.Capability {
	return executor.Define("demo.echo", executor.Meta{
		Description: "Returns its input.",
		Expose:      executor.On(executor.SurfaceDirect, executor.SurfaceMCP),
		SideEffect:  executor.SideEffectNone,
	}, func(ctx context.Context, c executor.Call[echoIn]) (echoIn, error) {
		if calls != nil {
			calls.Add(1)
		}
		return c.Input, nil
	})
}

// startWorker runs a worker on nc until the test ends and waits until it
// serves every capability.
func startWorker(t *testing.T, nc *nats.Conn, cfg executor.WorkerConfig, caps ...executor.Capability) *executor.Worker {
	t.Helper()
	return runWorkerOn(t, nc, cfg, caps...).Worker
}

// runWorkerOn is startWorker with the worker's Stop, for a test that stops it
// before it ends.
func runWorkerOn(t *testing.T, nc *nats.Conn, cfg executor.WorkerConfig, caps ...executor.Capability) *capstantest.Running {
	t.Helper()
	reg, err := executor.NewRegistry(caps...)
	if err != nil {
		t.Fatal(err)
	}
	w := capstantest.Worker(t, reg, capstantest.WithConn(nc), capstantest.WithConfig(cfg))
	trackWorker(t, w.Worker)
	return w
}

// workers lists the workers each test started, for flushAudit.
var workers = struct {
	sync.Mutex
	of map[testing.TB][]*executor.Worker
}{of: map[testing.TB][]*executor.Worker{}}

func trackWorker(t testing.TB, w *executor.Worker) {
	workers.Lock()
	defer workers.Unlock()
	if _, ok := workers.of[t]; !ok {
		t.Cleanup(func() {
			workers.Lock()
			defer workers.Unlock()
			delete(workers.of, t)
		})
	}
	workers.of[t] = append(workers.of[t], w)
}

// flushAudit waits until every audit event emitted by the workers the test
// started is stored (a stopped worker flushed as it stopped).
func flushAudit(t testing.TB) {
	t.Helper()
	workers.Lock()
	ws := append([]*executor.Worker(nil), workers.of[t]...)
	workers.Unlock()
	ctx := ctxT(t)
	for _, w := range ws {
		if err := w.FlushAudit(ctx); err != nil {
			t.Fatalf("audit events not stored: %v", err)
		}
	}
}

// waitServing waits until the catalog lists id, which a worker writes at start.
func waitServing(t *testing.T, nc *nats.Conn, id string) {
	t.Helper()
	c := newClient(t, nc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		if _, err := testhooks.Broker(c).Catalog.Get(ctx, id); err == nil {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no worker serves %s", id)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// newClient provisions the resources, as a server or a worker would (a client
// never does), and opens a client acting for alice.
func newClient(t *testing.T, nc *nats.Conn) *executor.Client {
	t.Helper()
	if _, err := broker.Provision(ctxT(t), nc, broker.Config{}); err != nil {
		t.Fatal(err)
	}
	c, err := executor.NewClient(nc, executor.ClientConfig{Actor: alice})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// waitUntil polls cond until it holds, failing the test with what when the
// test's own wait (ctxT) runs out first.
func waitUntil(t testing.TB, what string, cond func() bool) {
	t.Helper()
	ctx := ctxT(t)
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("never: %s", what)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// trackedWorker is capstantest.Worker for a test that flushes its workers'
// audit events (flushAudit).
func trackedWorker(t testing.TB, reg *executor.Registry, opts ...capstantest.Option) *capstantest.Running {
	t.Helper()
	w := capstantest.Worker(t, reg, opts...)
	trackWorker(t, w.Worker)
	return w
}
