package executor_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/executor"
)

type RefundOrder struct {
	OrderID string `json:"orderId"`
	Amount  int    `json:"amount"`
}

// A write may be retried only when it is idempotent: its handler makes a
// repeated attempt harmless by recording the effect under Call.IdempotencyKey,
// which is derived from the principal and the execution id together, so every
// attempt, redelivery and takeover of one execution carries the same key, and
// two principals' executions of one id carry two.
//
// Here the effect lives in a KV bucket, and the first attempt records the
// refund but fails before it can answer, as a payment service that times out
// after it took the order might. The second attempt finds the refund under its
// key and records nothing new.
func ExampleCall_idempotencyKey() {
	nc, cleanup := exampleConn()
	defer cleanup()
	ctx := context.Background()
	js, err := jetstream.New(nc)
	check(err)
	refunds, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "EXAMPLE_REFUNDS"})
	check(err)

	refund := executor.Define("orders.refund", executor.Meta{
		Description: "Refunds an order.",
		Expose:      executor.On(executor.SurfaceDirect),
		SideEffect:  executor.SideEffectWrite,
		Idempotent:  true, // reviewable: the handler deduplicates with the key
		Retry:       &executor.Retry{MaxAttempts: 1, Backoff: 10 * time.Millisecond},
	}, func(ctx context.Context, call executor.Call[RefundOrder]) (string, error) {
		_, err := refunds.Create(ctx, call.IdempotencyKey, []byte(call.Input.OrderID))
		switch {
		case errors.Is(err, jetstream.ErrKeyExists):
			// An earlier attempt of this execution refunded it already.
		case err != nil:
			return "", err
		}
		if call.Attempt == 1 {
			return "", executor.Retryable("The payment service did not answer; try again.")
		}
		return "refunded " + call.Input.OrderID, nil
	})
	stop := exampleWorker(nc, executor.WorkerConfig{}, refund)
	defer stop()
	c := exampleClient(nc)
	defer c.Close()

	env, err := c.Call(ctx, "orders.refund", RefundOrder{OrderID: "o1", Amount: 30}, executor.As(exampleAlice))
	check(err)
	var out string
	check(env.Output.Decode(&out))
	fmt.Println(env.Status, "after", env.Attempts, "attempts:", out)

	keys, err := refunds.ListKeys(ctx)
	check(err)
	n := 0
	for range keys.Keys() {
		n++
	}
	fmt.Println("refunds recorded:", n)
	// Output:
	// completed after 2 attempts: refunded o1
	// refunds recorded: 1
}
