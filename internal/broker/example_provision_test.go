package broker_test

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/natsserver"
)

// Provision every resource, then keep a record with compare-and-swap: a
// create-only write, a read that returns the revision, an update at that
// revision, and the sentinels a lost race reports.
func ExampleProvision() {
	dir, _ := os.MkdirTemp("", "capstan-example")
	defer os.RemoveAll(dir)
	s, err := natsserver.Start(natsserver.Options{StoreDir: dir, Port: -1})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { s.Shutdown(); s.WaitForShutdown() }()

	nc, err := broker.Connect(broker.ConnectOptions{URL: natsserver.ClientURL(s)})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer nc.Close()
	ctx := context.Background()
	b, err := broker.Provision(ctx, nc, broker.Config{})
	if err != nil {
		fmt.Println(err)
		return
	}
	pool, err := b.EnsurePool(ctx, broker.PoolConfig{Pool: "billing", Capabilities: []string{"orders.refund"}})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(b.Exec.CachedInfo().Config.Name, pool.CachedInfo().Name, pool.CachedInfo().Config.FilterSubjects)

	type approval struct {
		V     int    `json:"v"`
		State string `json:"state"`
	}
	if _, err := broker.Create(ctx, b.Approvals, "a1", &approval{V: 1, State: "pending"}); err != nil {
		fmt.Println(err)
		return
	}
	_, err = broker.Create(ctx, b.Approvals, "a1", &approval{V: 1, State: "pending"})
	fmt.Println("second create:", errors.Is(err, broker.ErrExists))

	a, rev, _ := broker.Load[approval](ctx, b.Approvals, "a1")
	a.State = "approved"
	if _, err := broker.Update(ctx, b.Approvals, "a1", a, rev); err != nil {
		fmt.Println(err)
		return
	}
	_, err = broker.Update(ctx, b.Approvals, "a1", &approval{V: 1, State: "denied"}, rev)
	fmt.Println("stale update:", errors.Is(err, broker.ErrRevisionMismatch))

	a, _, _ = broker.Load[approval](ctx, b.Approvals, "a1")
	fmt.Println(a.State)
	// Output:
	// CAPSTAN_EXEC pool-billing [capstan.exec.*.orders.refund]
	// second create: true
	// stale update: true
	// approved
}
