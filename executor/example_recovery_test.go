package executor_test

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/capstan-dev/capstan/executor"
)

type Charge struct {
	Card   string `json:"card"`
	Amount int    `json:"amount"`
}

// gateway stands for a payment provider that keys charges on an idempotency
// key, as real ones do.
type gateway struct {
	mu      sync.Mutex
	charges map[string]string // idempotency key → charge id
}

func (g *gateway) charge(key string) string {
	g.mu.Lock()
	defer g.mu.Unlock()
	if id, ok := g.charges[key]; ok {
		return id
	}
	id := fmt.Sprintf("ch_%d", len(g.charges)+1)
	g.charges[key] = id
	return id
}

func (g *gateway) lookup(key string) (string, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	id, ok := g.charges[key]
	return id, ok
}

// A handler records a receipt as soon as its effect has happened: here the
// charge id, before a slow confirmation step. When the attempt then times
// out, the execution does not end TIMEOUT (which would leave the caller
// guessing whether the card was charged): it completes from the receipt, and
// says so.
func ExampleCall_Receipt() {
	nc, cleanup := exampleConn()
	defer cleanup()
	ctx := context.Background()
	gw := &gateway{charges: map[string]string{}}

	charge := executor.Define("payments.charge", executor.Meta{
		Description: "Charges a card.",
		Expose:      executor.On(executor.SurfaceDirect),
		SideEffect:  executor.SideEffectExternal,
		Timeout:     100 * time.Millisecond,
	}, func(ctx context.Context, call executor.Call[Charge]) (string, error) {
		id := gw.charge(call.IdempotencyKey)
		if err := call.Receipt(ctx, id); err != nil {
			return "", err
		}
		<-ctx.Done() // a confirmation step that never ends
		return "", ctx.Err()
	})
	stop := exampleWorker(nc, executor.WorkerConfig{}, charge)
	defer stop()
	c := exampleClient(nc)
	defer c.Close()

	env, err := c.Call(ctx, "payments.charge", Charge{Card: "4242", Amount: 900}, executor.As(exampleAlice))
	check(err)
	var out string
	check(env.Output.Decode(&out))
	fmt.Println(env.Status, out, "recovered from", env.Recovered.How, "of attempt", env.Recovered.Attempt)
	fmt.Println(len(gw.charges), "charge")
	// Output:
	// completed ch_1 recovered from receipt of attempt 1
	// 1 charge
}

// A reconciler asks the system where the effect lives whether a lost
// attempt took effect. Here the first worker goes away during an attempt
// that had charged the card but recorded nothing; the worker that takes the
// execution over does not charge again on a guess: it asks the gateway by
// the idempotency key, finds the charge, and completes from it.
func ExampleWithRecovery() {
	nc, cleanup := exampleConn()
	defer cleanup()
	ctx := context.Background()
	gw := &gateway{charges: map[string]string{}}
	calls := make(chan struct{}, 2)

	define := func() executor.Capability {
		return executor.Define("payments.charge", executor.Meta{
			Description: "Charges a card.",
			Expose:      executor.On(executor.SurfaceDirect),
			SideEffect:  executor.SideEffectExternal,
		}, func(ctx context.Context, call executor.Call[Charge]) (string, error) {
			gw.charge(call.IdempotencyKey)
			calls <- struct{}{}
			<-ctx.Done() // the worker goes away before the charge is reported
			return "", ctx.Err()
		}, executor.WithRecovery(executor.Recovery[Charge, string]{
			// The gateway answers "no such key" authoritatively, and keys
			// charges on it: its absence is a proof.
			ProvesAbsence: true,
			Reconcile: func(ctx context.Context, q executor.Reconciliation[Charge]) (executor.Reconciled[string], error) {
				if id, ok := gw.lookup(q.IdempotencyKey); ok {
					return executor.Found(id), nil
				}
				return executor.Reconciled[string]{Effect: executor.EffectAbsent}, nil
			},
		}))
	}
	leaving := exampleWorker(nc, executor.WorkerConfig{ID: "leaving", Lease: time.Second, Grace: 10 * time.Millisecond}, define())
	c := exampleClient(nc)
	defer c.Close()
	id, err := c.Submit(ctx, "payments.charge", Charge{Card: "4242", Amount: 900}, executor.As(exampleAlice))
	check(err)
	<-calls
	leaving() // its lease given back, the attempt left running

	staying := exampleWorker(nc, executor.WorkerConfig{ID: "staying", Lease: time.Second}, define())
	defer staying()
	env, err := c.Await(ctx, id)
	check(err)
	var out string
	check(env.Output.Decode(&out))
	fmt.Println(env.Status, out, "recovered by the", env.Recovered.How, "after", env.Attempts, "attempt")
	fmt.Println(len(gw.charges), "charge,", len(calls), "more handler calls")
	fmt.Println(env.Recovered.ForModel())
	// Output:
	// completed ch_1 recovered by the reconciler after 1 attempt
	// 1 charge, 0 more handler calls
	// The operation took effect (attempt 1). Its worker was lost before reporting the result; this result was recovered by checking the system where the effect lives. Do not call it again to make sure.
}
