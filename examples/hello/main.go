// Command hello is the README's first example as a program: a capability, a
// worker serving it and a client calling it, in one process.
//
//	go run ./cmd/capstan dev      # in one shell: JetStream on loopback, the demo worker
//	go run ./examples/hello       # in another: completed 1 Hello, Ada!
//
// (`capstan server`, with no worker, does as well.) The program calls once its
// worker is ready (executor.Worker.Ready): greet.hello is listed in the
// catalog and served, so that the demo worker, which does not serve it, leaves
// the call to this one instead of ending it CAPABILITY_NOT_FOUND.
//
// It connects to $CAPSTAN_NATS_URL (default nats://127.0.0.1:4222). What it
// links is what a program using capstan as a library links: the NATS client,
// msgpack and uuid, never the server (scripts/check-deps.sh checks it, and
// scripts/binary-size.sh compares its size with nats.go's alone).
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
)

type Greeting struct {
	Name string `json:"name"`
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, broker.ConnectOptions{Name: "hello"}, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "hello:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, opts broker.ConnectOptions, out io.Writer) error {
	hello := executor.Define("greet.hello", executor.Meta{
		Description: "Greets someone by name.",
		Expose:      executor.On(executor.SurfaceDirect),
		SideEffect:  executor.SideEffectNone,
	}, func(ctx context.Context, call executor.Call[Greeting]) (string, error) {
		return "Hello, " + call.Input.Name + "!", nil
	})
	reg, err := executor.NewRegistry(hello) // every metadata problem, at once
	if err != nil {
		return err
	}
	nc, err := broker.Connect(opts)
	if err != nil {
		return err
	}
	defer nc.Close()
	w, err := executor.NewWorker(nc, reg, executor.WorkerConfig{Pool: "greeters"})
	if err != nil {
		return err
	}
	wctx, stopWorker := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }() // until wctx ends, then drains
	select {
	case <-w.Ready(): // greet.hello is listed and served: call it at once
	case err := <-done:
		stopWorker()
		if err == nil {
			err = ctx.Err() // interrupted before it served
		}
		return err
	}
	defer func() { stopWorker(); <-done }()

	c, err := executor.NewClient(nc, executor.ClientConfig{Surface: executor.SurfaceDirect})
	if err != nil {
		return err
	}
	defer c.Close()
	ada := envelope.Actor{Kind: envelope.ActorUser, ID: "ada"}
	env, err := c.Call(ctx, "greet.hello", Greeting{Name: "Ada"}, executor.As(ada))
	if err != nil {
		return err // transport trouble only: governed failures are in env
	}
	if env.Status != envelope.StatusCompleted { // failed, cancelled or approval-required: no output to decode
		return fmt.Errorf("%s: %+v", env.Status, env.Error)
	}
	var greeting string
	if err := env.Output.Decode(&greeting); err != nil {
		return err
	}
	_, err = fmt.Fprintln(out, env.Status, env.Attempts, greeting)
	return err
}
