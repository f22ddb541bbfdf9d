package executor_test

import (
	"context"
	"fmt"
	"time"

	"github.com/capstan-dev/capstan/executor"
)

type Report struct {
	Month string `json:"month"`
}

// slowReport works for a minute unless its context ends first, as a handler
// must: the context carries the attempt's timeout and the caller's cancel.
func slowReport(meta executor.Meta, started chan<- struct{}) executor.Capability {
	return executor.Define("reports.build", meta, func(ctx context.Context, call executor.Call[Report]) (string, error) {
		if started != nil {
			started <- struct{}{}
		}
		select {
		case <-time.After(time.Minute):
			return "report for " + call.Input.Month, nil
		case <-ctx.Done():
			return "", ctx.Err()
		}
	})
}

// Meta.Timeout arms per attempt. A timed-out attempt is retryable, so a read
// with a retry gets a second attempt; when the last attempt times out, the
// runtime has stopped the handler: the envelope is cancelled, its code
// TIMEOUT (still retryable for the caller, who may call again).
func ExampleMeta_timeout() {
	nc, cleanup := exampleConn()
	defer cleanup()
	ctx := context.Background()

	report := slowReport(executor.Meta{
		Description: "Builds the monthly sales report.",
		Expose:      executor.On(executor.SurfaceDirect),
		SideEffect:  executor.SideEffectRead,
		Timeout:     50 * time.Millisecond,
		Retry:       &executor.Retry{MaxAttempts: 1, Backoff: 10 * time.Millisecond},
	}, nil)
	stop := exampleWorker(nc, executor.WorkerConfig{}, report)
	defer stop()
	c := exampleClient(nc)
	defer c.Close()

	env, err := c.Call(ctx, "reports.build", Report{Month: "2026-01"}, executor.As(exampleAlice))
	check(err)
	fmt.Println(env.Status, env.Error.Code, "after", env.Attempts, "attempts")
	fmt.Println(env.Error.Message, "retryable:", env.Error.Retryable)
	// Output:
	// cancelled TIMEOUT after 2 attempts
	// The operation did not finish within 50ms. retryable: true
}

// Client.Cancel stops an execution wherever it is: before a worker claims
// it, during an attempt or during a backoff. It is terminal and never
// retried: the envelope is cancelled, its code CANCELLED.
func ExampleClient_Cancel() {
	nc, cleanup := exampleConn()
	defer cleanup()
	ctx := context.Background()

	started := make(chan struct{}, 1)
	report := slowReport(executor.Meta{
		Description: "Builds the monthly sales report.",
		Expose:      executor.On(executor.SurfaceDirect),
		SideEffect:  executor.SideEffectRead,
		Retry:       &executor.Retry{MaxAttempts: 2},
	}, started)
	stop := exampleWorker(nc, executor.WorkerConfig{}, report)
	defer stop()
	c := exampleClient(nc)
	defer c.Close()

	id, err := c.Submit(ctx, "reports.build", Report{Month: "2026-01"}, executor.As(exampleAlice))
	check(err)
	<-started // the handler runs

	_, err = c.Cancel(ctx, id) // the workers stop the attempt at once
	check(err)

	env, err := c.Await(ctx, id)
	check(err)
	fmt.Println(env.Status, env.Error.Code, "after", env.Attempts, "attempt")
	fmt.Println(env.Error.Message)
	// Output:
	// cancelled CANCELLED after 1 attempt
	// The caller cancelled the execution.
}
