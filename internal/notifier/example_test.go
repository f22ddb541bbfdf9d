package notifier_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/natsserver"
	"github.com/capstan-dev/capstan/internal/notifier"
	"github.com/capstan-dev/capstan/notify"
)

type Refund struct {
	OrderID string `json:"orderId"`
	Amount  int    `json:"amount"`
}

// A refund above 500 waits for a finance approval. A notifier posts the
// request to the finance team's webhook, signed, and follows up with the
// decision; the receiver checks each signature and keeps the idempotency
// key.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "capstan-example-")
	defer os.RemoveAll(dir)
	srv, err := natsserver.Start(natsserver.Options{StoreDir: dir, Port: -1})
	check(err)
	defer srv.Shutdown()
	var conns []*nats.Conn
	defer func() {
		for _, nc := range conns {
			nc.Close()
		}
	}()
	connect := func() *nats.Conn {
		nc, err := nats.Connect(natsserver.ClientURL(srv))
		check(err)
		conns = append(conns, nc)
		return nc
	}

	_, err = broker.Provision(ctx, connect(), broker.Config{}) // as capstan server does
	check(err)

	// The finance team's receiver.
	secret := "whsec-finance-0123456789"
	got := make(chan string, 10)
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if err := notify.Verify([]byte(secret), r.Header.Get(notify.SignatureHeader), body, time.Now(), 0); err != nil {
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		var p notify.Payload
		_ = json.Unmarshal(body, &p)
		got <- fmt.Sprintf("%s %s for %s, key %t", p.Event, p.Approval.CapabilityID, p.Approval.Actor, p.IdempotencyKey == r.Header.Get(notify.IdempotencyHeader))
	}))
	defer hook.Close()

	// A worker serving a refund that needs a finance approval above 500.
	refund := executor.Define("orders.refund", executor.Meta{
		Description: "Refunds an order.", Expose: executor.On(executor.SurfaceDirect), SideEffect: executor.SideEffectWrite,
		Policies: []executor.Policy{{Name: "finance-above-500", Evaluate: func(ctx context.Context, r executor.PolicyRequest) (executor.Decision, error) {
			if r.Input.(*Refund).Amount > 500 {
				return executor.Decision{Stance: executor.StanceRequireApproval, ApprovalTypes: []string{"finance"}, Reason: "above 500"}, nil
			}
			return executor.Decision{Stance: executor.StanceAllow}, nil
		}}},
	}, func(ctx context.Context, c executor.Call[Refund]) (string, error) { return "refunded", nil })
	reg, err := executor.NewRegistry(refund)
	check(err)
	w, err := executor.NewWorker(connect(), reg, executor.WorkerConfig{Logger: slog.New(slog.DiscardHandler)})
	check(err)
	wctx, stopWorker := context.WithCancel(ctx)
	workerDone := make(chan error, 1)
	go func() { workerDone <- w.Run(wctx) }()
	defer func() { stopWorker(); <-workerDone }()

	// The notifier: one webhook channel for the finance approvals.
	n, err := notifier.New(connect(), notifier.Config{
		ConsoleURL: "https://capstan.example.com",
		Channels: []notifier.Channel{{Name: "finance-hook", Kind: notifier.KindWebhook, Types: []string{"finance"},
			URL: notifier.Secret(hook.URL), Secret: notifier.Secret(secret)}},
		Provision: true, // this connection may create the channel's consumer
		Logger:    slog.New(slog.DiscardHandler),
	})
	check(err)
	nctx, stopNotifier := context.WithCancel(ctx)
	notifierDone := make(chan error, 1)
	go func() { notifierDone <- n.Run(nctx) }()
	defer func() { stopNotifier(); <-notifierDone }()

	client, err := executor.NewClient(connect(), executor.ClientConfig{Actor: envelope.Actor{Kind: "user", ID: "alice"}})
	check(err)
	defer client.Close()
	env, err := client.Call(ctx, "orders.refund", Refund{OrderID: "o1", Amount: 900})
	check(err)
	fmt.Println(env.Status)
	fmt.Println(<-got)

	_, err = client.Decide(ctx, env.Approval.ID, approvals.Verdict{Approve: true, Approver: envelope.Actor{Kind: "user", ID: "carol"}})
	check(err)
	fmt.Println(<-got)
	// Output:
	// approval-required
	// approval.requested orders.refund for user:alice, key true
	// approval.approved orders.refund for user:alice, key true
}

func check(err error) {
	if err != nil {
		panic(err)
	}
}
