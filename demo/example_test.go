package demo_test

import (
	"context"
	"fmt"
	"os"

	"github.com/capstan-dev/capstan/demo"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/natsserver"
)

// A worker serving the demo catalog, and demo.flaky asked to fail its first
// attempt: the runtime retries it (it only reads), and the calls stream
// holds one call per attempt.
func Example() {
	dir, err := os.MkdirTemp("", "capstan-demo-example-")
	check(err)
	defer os.RemoveAll(dir)
	s, err := natsserver.Start(natsserver.Options{StoreDir: dir, Port: -1}) // yours: `capstan server`
	check(err)
	defer s.WaitForShutdown()
	defer s.Shutdown()
	nc, err := broker.Connect(broker.ConnectOptions{URL: natsserver.ClientURL(s)})
	check(err)
	defer nc.Close()
	ctx, stop := context.WithCancel(context.Background())

	js, err := demo.Provision(ctx, nc, 0)
	check(err)
	reg, err := executor.NewRegistry(demo.Catalog(js)...)
	check(err)
	w, err := executor.NewWorker(nc, reg, executor.WorkerConfig{})
	check(err)
	done := make(chan error)
	go func() { done <- w.Run(ctx) }()

	c, err := executor.NewClient(nc, executor.ClientConfig{Actor: envelope.Actor{Kind: envelope.ActorUser, ID: "ada"}})
	check(err)
	env, err := c.Call(ctx, "demo.flaky", demo.FlakyInput{FailTimes: 1})
	check(err)
	var out demo.FlakyOutput
	check(env.Output.Decode(&out))
	calls, err := demo.ReadCalls(ctx, js)
	check(err)
	fmt.Println(env.Status, "on attempt", out.Attempt, "of", env.Attempts)
	for _, call := range calls {
		fmt.Println(call.CapabilityID, "attempt", call.Attempt)
	}

	check(c.Close())
	stop()
	check(<-done)
	// Output:
	// completed on attempt 2 of 2
	// demo.flaky attempt 1
	// demo.flaky attempt 2
}

func check(err error) {
	if err != nil {
		panic(err)
	}
}
