package executor_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/broker"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
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
		SideEffect:  executor.None,
	}, func(ctx context.Context, c executor.Call[echoIn]) (echoIn, error) {
		if calls != nil {
			calls.Add(1)
		}
		return c.Input, nil
	})
}

// startWorker runs a worker until the test ends and waits until it serves.
func startWorker(t *testing.T, nc *nats.Conn, cfg executor.WorkerConfig, caps ...executor.Capability) *executor.Worker {
	t.Helper()
	reg, err := executor.NewRegistry(caps...)
	if err != nil {
		t.Fatal(err)
	}
	w, err := executor.NewWorker(nc, reg, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("worker: %v", err)
		}
	})
	waitServing(t, nc, caps[0].ID())
	return w
}

// waitServing waits until the catalog lists id, which a worker writes at start.
func waitServing(t *testing.T, nc *nats.Conn, id string) {
	t.Helper()
	c := newClient(t, nc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		if _, err := c.Broker().Catalog.Get(ctx, id); err == nil {
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

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}
