package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/capstan-dev/capstan/internal/testhooks"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/natsserver"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

type noopIn struct {
	Data string `json:"data"`
}

// runCapstan runs the workload on an embedded JetStream server (file store)
// with one worker, audit on. With read, the no-op is a read declared
// Idempotent, which runs without a claim (design §14, "Reads without
// claims").
func runCapstan(ctx context.Context, wl workload, read bool) (*result, error) {
	url, stop, err := startServer("capstan-peers-")
	if err != nil {
		return nil, err
	}
	defer stop()
	connect := func() (*nats.Conn, error) { return broker.Connect(broker.ConnectOptions{URL: url}) }

	wnc, err := connect()
	if err != nil {
		return nil, err
	}
	defer wnc.Close()
	meta := executor.Meta{Description: "Does nothing.", Expose: executor.On(executor.SurfaceDirect), SideEffect: executor.SideEffectNone}
	if read {
		meta.SideEffect, meta.Idempotent = executor.SideEffectRead, true
	}
	reg, err := executor.NewRegistry(executor.Define("bench.noop", meta, func(ctx context.Context, c executor.Call[noopIn]) (struct{}, error) { return struct{}{}, nil }))
	if err != nil {
		return nil, err
	}
	w, err := executor.NewWorker(wnc, reg, executor.WorkerConfig{Concurrency: wl.concurrency, Grace: 5 * time.Second})
	if err != nil {
		return nil, err
	}
	wctx, stopWorker := context.WithCancel(ctx)
	workerDone := make(chan error, 1)
	go func() { workerDone <- w.Run(wctx) }()
	defer func() { stopWorker(); <-workerDone }()

	cnc, err := connect()
	if err != nil {
		return nil, err
	}
	defer cnc.Close()
	c, err := executor.NewClient(cnc, executor.ClientConfig{Actor: envelope.Actor{Kind: envelope.ActorService, ID: "bench"}})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if err := waitCatalog(ctx, c, "bench.noop"); err != nil {
		return nil, err
	}

	t := newTracker(wl.n)
	names := testhooks.Broker(c).Names
	sub, err := cnc.Subscribe(names.EnvelopeSubjects(), func(m *nats.Msg) {
		// The envelope's key is <principal>.<executionId>.
		_, id, _ := strings.Cut(names.EnvelopeKeyFromSubject(m.Subject), ".")
		t.finish(id)
	})
	if err != nil {
		return nil, err
	}
	defer sub.Unsubscribe()
	_ = sub.SetPendingLimits(-1, -1)

	input := envelope.MustRaw(noopIn{Data: string(wl.payload)})
	cpu, err := t.measure(ctx, wl, envelope.NewExecutionID, func(ctx context.Context, id string) error {
		_, err := c.Submit(ctx, "bench.noop", input, executor.WithID(id))
		return err
	})
	if err != nil {
		return nil, err
	}
	system := "capstan"
	if read {
		system = "capstan, a read without claims"
	}
	return t.result(system, embeddedJetStream+", audit on", cpu), nil
}

// embeddedJetStream is the backend of the runs on a server startServer
// started.
var embeddedJetStream = "NATS JetStream " + server.VERSION + " (embedded, file store)"

// startServer starts an embedded JetStream server on a file store in a
// temporary directory (its name begins with dirPrefix) and returns its URL
// and what stops it and removes the directory.
func startServer(dirPrefix string) (url string, stop func(), err error) {
	dir, err := os.MkdirTemp("", dirPrefix)
	if err != nil {
		return "", nil, err
	}
	srv, err := natsserver.Start(natsserver.Options{StoreDir: dir, Port: -1})
	if err != nil {
		os.RemoveAll(dir)
		return "", nil, err
	}
	return natsserver.ClientURL(srv), func() {
		srv.Shutdown()
		srv.WaitForShutdown()
		os.RemoveAll(dir)
	}, nil
}

// waitCatalog waits until the worker has published its capability, so that
// the client routes straight to it.
func waitCatalog(ctx context.Context, c *executor.Client, id string) error {
	for {
		if _, err := testhooks.Broker(c).Catalog.Get(ctx, id); err == nil {
			time.Sleep(100 * time.Millisecond) // the client's catalog watcher sees it too
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no worker serves %s: %w", id, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}
