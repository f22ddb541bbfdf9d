package observe_test

import (
	"context"
	"fmt"
	"os"
	"sync"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/natsserver"
	"github.com/capstan-dev/capstan/observe"
)

// outcomes is an observer that keeps the status of each envelope its worker
// finalized, and the attempts it started: the few lines an embedder needs
// for counters of their own.
type outcomes struct {
	observe.NopWorker
	mu       sync.Mutex
	statuses []string
	attempts int
}

func (o *outcomes) Begin(ctx context.Context, d observe.Delivery) (context.Context, observe.Execution) {
	return ctx, &outcome{o: o}
}

type outcome struct {
	observe.NopExecution
	o *outcomes
}

func (x *outcome) Attempt(ctx context.Context, n int) (context.Context, func(envelope.Code)) {
	x.o.mu.Lock()
	x.o.attempts++
	x.o.mu.Unlock()
	return ctx, func(envelope.Code) {}
}

func (x *outcome) Finalized(env *envelope.Envelope) {
	x.o.mu.Lock()
	defer x.o.mu.Unlock()
	x.o.statuses = append(x.o.statuses, env.CapabilityID+" "+string(env.Status))
}

func Example() {
	url, stopServer := exampleServer()
	defer stopServer()
	ctx, stop := context.WithCancel(context.Background())

	hello := executor.Define("greet.hello", executor.Meta{
		Description: "Greets someone by name.",
		Expose:      executor.On(executor.SurfaceDirect),
		SideEffect:  executor.SideEffectNone,
	}, func(ctx context.Context, call executor.Call[string]) (string, error) {
		return "Hello, " + call.Input + "!", nil
	})
	reg, err := executor.NewRegistry(hello)
	check(err)
	nc, err := broker.Connect(broker.ConnectOptions{URL: url})
	check(err)
	obs := &outcomes{}
	w, err := executor.NewWorker(nc, reg, executor.WorkerConfig{Pool: "greeters", Observer: obs})
	check(err)
	done := make(chan error)
	go func() { done <- w.Run(ctx) }()

	c, err := executor.NewClient(nc, executor.ClientConfig{})
	check(err)
	_, err = c.Call(ctx, "greet.hello", "Ada", executor.As(envelope.Actor{Kind: envelope.ActorUser, ID: "ada"}))
	check(err)
	check(c.Close())
	stop()
	check(<-done) // every delivery has ended
	nc.Close()
	fmt.Println(obs.statuses, obs.attempts)
	// Output: [greet.hello completed] 1
}

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

func check(err error) {
	if err != nil {
		panic(err)
	}
}
