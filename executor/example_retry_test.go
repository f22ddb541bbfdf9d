package executor_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/capstan-dev/capstan/executor"
)

type StockQuery struct {
	SKU string `json:"sku"`
}

// A read may be retried by the runtime: Retry.MaxAttempts is the number of
// attempts after the first, and a handler says a failure is worth another
// attempt by returning executor.Retryable. The re-attempt runs under the same
// execution id; the envelope counts the attempts.
func ExampleRetry() {
	nc, cleanup := exampleConn()
	defer cleanup()
	ctx := context.Background()

	stock := executor.Define("inventory.stock", executor.Meta{
		Description: "Counts the units of a product in stock.",
		Expose:      executor.On(executor.SurfaceDirect),
		SideEffect:  executor.SideEffectRead,
		Retry:       &executor.Retry{MaxAttempts: 2, Backoff: 10 * time.Millisecond},
	}, func(ctx context.Context, call executor.Call[StockQuery]) (int, error) {
		if call.Attempt == 1 {
			return 0, executor.Retryable("The warehouse did not answer; try again.")
		}
		return 42, nil
	})
	stop := exampleWorker(nc, executor.WorkerConfig{}, stock)
	defer stop()
	c := exampleClient(nc)
	defer c.Close()

	env, err := c.Call(ctx, "inventory.stock", StockQuery{SKU: "sku-1"}, executor.As(exampleAlice))
	check(err)
	var units int
	check(env.Output.Decode(&units))
	fmt.Println(env.Status, "after", env.Attempts, "attempts:", units)
	// Output: completed after 2 attempts: 42
}

type Transfer struct {
	From   string `json:"from"`
	To     string `json:"to"`
	Amount int    `json:"amount"`
}

// A write is never retried by the runtime unless it declares itself
// idempotent (SI-11): the registry refuses a retry on it at start, listing
// every problem of every capability at once.
func ExampleRetry_writeNeedsIdempotent() {
	transfer := executor.Define("bank.transfer", executor.Meta{
		Description: "Moves money between two accounts.",
		Expose:      executor.On(executor.SurfaceDirect),
		SideEffect:  executor.SideEffectWrite,
		Retry:       &executor.Retry{MaxAttempts: 3},
	}, func(ctx context.Context, call executor.Call[Transfer]) (string, error) {
		return "done", nil
	})

	_, err := executor.NewRegistry(transfer)
	var re *executor.RegistryError
	fmt.Println(errors.As(err, &re), len(re.Problems))
	fmt.Println(err)
	// Output:
	// true 1
	// capstan: 1 problem(s) in the capability registry:
	//   - bank.transfer: retry is configured on a write capability that is not declared idempotent (SI-11): declare idempotent: true and deduplicate with the idempotency key, or remove retry
}
