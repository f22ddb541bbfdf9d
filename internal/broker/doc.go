// Package broker is capstan's NATS JetStream plumbing: connecting, provisioning
// every stream, consumer and key-value bucket of the design idempotently, naming
// subjects and keys, and the compare-and-swap helpers the execution records,
// envelopes and approvals rely on.
//
// Every process may provision at start; provisioning over resources that already
// match is a no-op, and over a resource whose configuration conflicts it fails
// with an error naming the field instead of overwriting it:
//
//	nc, err := broker.Connect(broker.ConnectOptions{URL: "nats://127.0.0.1:4222"})
//	if err != nil { ... }
//	b, err := broker.Provision(ctx, nc, broker.Config{})
//	if err != nil { ... } // errors.Is(err, broker.ErrConfigConflict) on a mismatch
//	env, rev, err := broker.Load[envelope.Envelope](ctx, b.Envelopes, executionID)
//
// Each pool has one durable consumer whose filter is the union of its workers'
// capabilities. A worker that starts with a new capability widens it; nothing
// narrows it but deleting the consumer. JetStream rewrites a consumer without a
// revision check, so what each pool asked for is also kept in the pools bucket
// by compare-and-swap, and a widening rewrites the consumer until both agree:
// workers starting together never drop each other's capabilities.
package broker
