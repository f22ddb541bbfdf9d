package audit_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/natsserver"
)

type Ping struct {
	Host string `json:"host"`
}

// Read returns one execution's trail, oldest first. A runtime retry stays
// inside one execution: a capability.retried event between two
// capability.started events, each carrying its attempt.
func ExampleRead() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "capstan-example-")
	check(err)
	defer os.RemoveAll(dir)
	srv, err := natsserver.Start(natsserver.Options{StoreDir: dir, Port: -1})
	check(err)
	defer srv.WaitForShutdown()
	defer srv.Shutdown()
	nc, err := broker.Connect(broker.ConnectOptions{URL: natsserver.ClientURL(srv)})
	check(err)
	defer nc.Close()

	ping := executor.Define("net.ping", executor.Meta{
		Description: "Checks that a host answers.",
		Expose:      executor.On(executor.SurfaceDirect),
		SideEffect:  executor.SideEffectRead,
		Retry:       &executor.Retry{MaxAttempts: 1, Backoff: 10 * time.Millisecond},
	}, func(ctx context.Context, call executor.Call[Ping]) (bool, error) {
		if call.Attempt == 1 {
			return false, executor.Retryable("No answer yet; try again.")
		}
		return true, nil
	})
	reg, err := executor.NewRegistry(ping)
	check(err)
	w, err := executor.NewWorker(nc, reg, executor.WorkerConfig{})
	check(err)
	runCtx, stopWorker := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx) }()
	c, err := executor.NewClient(nc, executor.ClientConfig{})
	check(err)
	defer c.Close()

	alice := envelope.Actor{Kind: envelope.ActorUser, ID: "alice"}
	env, err := c.Call(ctx, "net.ping", Ping{Host: "db1"}, executor.As(alice))
	check(err)
	// Workers publish events asynchronously, in order; one that stops has
	// stored all of its events.
	stopWorker()
	check(<-done)

	trail, err := c.Trail(ctx, env.ExecutionID)
	check(err)
	for _, ev := range trail {
		if attempt, ok := ev.Data["attempt"]; ok {
			fmt.Println(ev.Type, "attempt", attempt)
		} else {
			fmt.Println(ev.Type)
		}
	}
	// Output:
	// capability.requested
	// capability.started attempt 1
	// capability.retried attempt 2
	// capability.started attempt 2
	// capability.completed
}

func check(err error) {
	if err != nil {
		panic(err)
	}
}
