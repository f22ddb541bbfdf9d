package executor_test

import (
	"context"
	"os"
	"time"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/natsserver"
	"github.com/nats-io/nats.go"
)

// What the examples share: a real JetStream server of their own, a worker
// serving a few capabilities, and the actors who call them. Outside an
// example, the server is `capstan dev`, `capstan server` or any JetStream.

var exampleAlice = envelope.Actor{Kind: envelope.ActorUser, ID: "alice"}

// exampleServer starts an embedded JetStream server on a free loopback port,
// storing in a new temporary directory that stop removes.
func exampleServer() (url string, stop func()) {
	dir, err := os.MkdirTemp("", "capstan-example-")
	check(err)
	s, err := natsserver.Start(natsserver.Options{StoreDir: dir, Port: -1})
	if err != nil {
		_ = os.RemoveAll(dir)
		panic(err)
	}
	return natsserver.ClientURL(s), func() {
		s.Shutdown()
		s.WaitForShutdown()
		_ = os.RemoveAll(dir)
	}
}

// exampleConn starts a server (see exampleServer) and connects to it; cleanup
// closes the connection and stops the server.
func exampleConn() (nc *nats.Conn, cleanup func()) {
	url, stopServer := exampleServer()
	nc, err := broker.Connect(broker.ConnectOptions{URL: url})
	if err != nil {
		stopServer()
		panic(err)
	}
	return nc, func() {
		nc.Close()
		stopServer()
	}
}

// exampleWorker runs a worker serving caps and returns once the catalog lists
// them, so that calls go straight to its pool. stop ends the worker and waits
// for its drain, which also flushes its audit events.
func exampleWorker(nc *nats.Conn, cfg executor.WorkerConfig, caps ...executor.Capability) (stop func()) {
	reg, err := executor.NewRegistry(caps...)
	check(err)
	w, err := executor.NewWorker(nc, reg, cfg)
	check(err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	stop = func() {
		cancel()
		check(<-done)
	}

	wait, cancelWait := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancelWait()
	b, err := broker.Provision(wait, nc, cfg.Broker)
	check(err)
	for _, c := range caps {
		for {
			if _, err := b.Catalog.Get(wait, c.ID()); err == nil {
				break
			}
			select {
			case <-wait.Done():
				stop()
				panic("no worker serves " + c.ID())
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	return stop
}

// exampleClient opens a client on the direct surface.
func exampleClient(nc *nats.Conn) *executor.Client {
	c, err := executor.NewClient(nc, executor.ClientConfig{Surface: executor.SurfaceDirect})
	check(err)
	return c
}

func check(err error) {
	if err != nil {
		panic(err)
	}
}
