package approvalstore_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/approvalstore"
	"github.com/capstan-dev/capstan/internal/auditemit"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/natsserver"
	"github.com/nats-io/nats.go"
)

// An approval is decided once, by someone other than the requester, and
// consumed once: a second execution finds it used.
func ExampleStore() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "capstan-example-")
	defer os.RemoveAll(dir)
	srv, err := natsserver.Start(natsserver.Options{StoreDir: dir, Port: -1})
	if err != nil {
		panic(err)
	}
	defer srv.Shutdown()
	nc, err := nats.Connect(natsserver.ClientURL(srv))
	if err != nil {
		panic(err)
	}
	defer nc.Close()
	b, err := broker.Provision(ctx, nc, broker.Config{})
	if err != nil {
		panic(err)
	}
	store := approvalstore.NewStore(b.Approvals, auditemit.New(b.NC, auditemit.Options{Prefix: b.Names.Prefix(), Audit: b.Audit, Index: b.Index}))

	alice := envelope.Actor{Kind: "user", ID: "alice"}
	bob := envelope.Actor{Kind: "user", ID: "bob"}
	input, hash, err := approvalstore.Canonical(envelope.MustRaw(map[string]any{"orderId": "o1", "amount": 900}))
	if err != nil {
		panic(err)
	}
	rec := &approvals.Record{
		ID: envelope.NewExecutionID(), CapabilityID: "orders.refund", Actor: alice,
		Input: input, InputHash: hash, RequestedBy: envelope.NewExecutionID(),
	}
	if err := store.Create(ctx, rec); err != nil {
		panic(err)
	}
	fmt.Println(rec.Status, string(rec.Input))

	_, err = store.Decide(ctx, rec.ID, approvals.Verdict{Approve: true, Approver: alice})
	fmt.Println(approvalstore.Code(err))

	decided, err := store.Decide(ctx, rec.ID, approvals.Verdict{Approve: true, Approver: bob, Comment: "checked the order"})
	if err != nil {
		panic(err)
	}
	fmt.Println(decided.Status, "by", decided.Decision.Approver)

	// A worker consumes it for the execution it runs, under that
	// execution's record (its creation time names it).
	resume, record := envelope.NewExecutionID(), time.Now()
	used, err := store.Consume(ctx, rec.ID, resume, record)
	if err != nil {
		panic(err)
	}
	fmt.Println(used.Status, used.ConsumedBy == resume)

	_, err = store.Consume(ctx, rec.ID, envelope.NewExecutionID(), time.Now())
	fmt.Println(errors.Is(err, approvals.ErrConsumed), approvalstore.Code(err))
	// The same execution id again, under a record made after the first
	// one's expired: the approval was spent.
	_, err = store.Consume(ctx, rec.ID, resume, time.Now())
	fmt.Println(errors.Is(err, approvals.ErrConsumed))
	// Output:
	// pending {"amount":900,"orderId":"o1"}
	// APPROVAL_SELF_APPROVAL
	// approved by user:bob
	// consumed true
	// true APPROVAL_CONSUMED
	// true
}
