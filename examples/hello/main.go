// Command hello is the README's first example as a program: a capability, a
// worker serving it and a client calling it, in one process.
//
//	go run ./cmd/capstan server   # in one shell: JetStream on loopback, no worker
//	go run ./examples/hello       # in another: completed 1 Hello, Ada!
//
// (Against `capstan dev`, whose demo worker is already serving, the call may
// reach that worker before this one has listed greet.hello in the catalog,
// and end CAPABILITY_NOT_FOUND: a worker and its clients usually live in
// different processes, the worker started first.)
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

	"github.com/capstan-dev/capstan/broker"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
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
	if env.Error != nil {
		return fmt.Errorf("%s: %s: %s", env.Status, env.Error.Code, env.Error.Message)
	}
	var greeting string
	if err := env.Output.Decode(&greeting); err != nil {
		return err
	}
	_, err = fmt.Fprintln(out, env.Status, env.Attempts, greeting)
	return err
}
