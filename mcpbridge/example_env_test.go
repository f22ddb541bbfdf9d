package mcpbridge_test

import (
	"context"
	"errors"
	"os"
	"time"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/natsserver"
	"github.com/nats-io/nats.go"
)

// exampleConn starts an embedded JetStream server in a temporary directory
// and connects to it; cleanup closes both. Yours: `capstan dev`, `capstan
// server`, or any JetStream deployment.
func exampleConn() (nc *nats.Conn, cleanup func()) {
	dir, err := os.MkdirTemp("", "capstan-mcp-example-")
	check(err)
	s, err := natsserver.Start(natsserver.Options{StoreDir: dir, Port: -1})
	check(err)
	nc, err = broker.Connect(broker.ConnectOptions{URL: natsserver.ClientURL(s)})
	check(err)
	return nc, func() {
		nc.Close()
		s.Shutdown()
		s.WaitForShutdown()
		_ = os.RemoveAll(dir)
	}
}

// exampleWorker serves caps until stop, and returns once describe lists them.
func exampleWorker(nc *nats.Conn, caps ...executor.Capability) (stop func()) {
	reg, err := executor.NewRegistry(caps...)
	check(err)
	w, err := executor.NewWorker(nc, reg, executor.WorkerConfig{})
	check(err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	stop = func() { cancel(); check(<-done) }

	c, err := executor.NewClient(nc, executor.ClientConfig{})
	check(err)
	defer c.Close()
	wait, cancelWait := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancelWait()
	for {
		d, err := c.Describe(wait, executor.SurfaceMCP, envelope.Actor{Kind: "user", ID: "example"}, executor.Scope{})
		if err == nil && len(d.Capabilities) == len(caps) {
			return stop
		}
		if err != nil && !errors.Is(err, executor.ErrNoWorkers) || wait.Err() != nil {
			stop()
			panic("the worker does not serve: " + errors.Join(err, wait.Err()).Error())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func check(err error) {
	if err != nil {
		panic(err)
	}
}
