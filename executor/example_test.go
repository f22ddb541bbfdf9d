package executor_test

import (
	"context"
	"fmt"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
)

type Greeting struct {
	Name string `json:"name"`
}

// A capability, a registry, a worker serving it and a client calling it: the
// README's first example. The worker and the client would usually live in
// different processes; any number of each may run. A program that starts a
// worker and calls it at once waits for Ready first: before it, another
// worker of the deployment (capstan dev's) could take the call and end it
// CAPABILITY_NOT_FOUND.
func Example() {
	url, stopServer := exampleServer() // yours: `capstan dev`, `capstan server` or any JetStream
	defer stopServer()
	ctx, stop := context.WithCancel(context.Background())

	hello := executor.Define("greet.hello", executor.Meta{
		Description: "Greets someone by name.",
		Expose:      executor.On(executor.SurfaceDirect),
		SideEffect:  executor.SideEffectNone,
	}, func(ctx context.Context, call executor.Call[Greeting]) (string, error) {
		return "Hello, " + call.Input.Name + "!", nil
	})
	reg, err := executor.NewRegistry(hello) // every metadata problem, at once
	check(err)
	nc, err := broker.Connect(broker.ConnectOptions{URL: url})
	check(err)
	w, err := executor.NewWorker(nc, reg, executor.WorkerConfig{Pool: "greeters"})
	check(err)
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }() // until ctx ends, then drains
	select {
	case <-w.Ready(): // greet.hello is listed and served: call it at once
	case err := <-done:
		check(err)
	}

	c, err := executor.NewClient(nc, executor.ClientConfig{Surface: executor.SurfaceDirect})
	check(err)
	ada := envelope.Actor{Kind: envelope.ActorUser, ID: "ada"}
	env, err := c.Call(ctx, "greet.hello", Greeting{Name: "Ada"}, executor.As(ada))
	check(err) // transport trouble only: governed failures are in env
	if env.Status != envelope.StatusCompleted {
		check(fmt.Errorf("%s: %+v", env.Status, env.Error)) // failed, cancelled or approval-required
	}
	var out string
	check(env.Output.Decode(&out))
	fmt.Println(env.Status, env.Attempts, out) // completed 1 Hello, Ada!

	check(c.Close())
	stop()
	check(<-done)
	nc.Close()
	// Output: completed 1 Hello, Ada!
}
