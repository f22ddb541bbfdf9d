package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/capstan-dev/capstan/auth"
	"github.com/capstan-dev/capstan/broker"
	"github.com/nats-io/nats.go/jetstream"
)

func runDev(args []string) int {
	fs := newFlags("dev", "[--store DIR] [--listen HOST:PORT] [--auth DIR] [--audit-max-age D] [worker flags]")
	sf := addServerFlags(fs, "capstan-dev")
	wf := addWorkerFlags(fs)
	if _, code, ok := parseFlags(fs, args, 0); !ok {
		return code
	}
	opts, err := sf.options()
	if err != nil {
		return usageError("%v", err)
	}
	log := newLogger(slog.LevelInfo)
	ctx, stop := signalContext()
	defer stop()

	bcfg := sf.brokerConfig()
	bcfg.Replicas = wf.replicas
	e, err := startEmbedded(ctx, opts, bcfg, sf.setup, sf.wait, log)
	if err != nil {
		return fail(exitFailed, "dev: %v", err)
	}
	defer e.stop()
	wnc, wjs := e.nc, e.js
	if sf.setup != nil {
		// The demo worker connects as the worker principal, as a real one does.
		wnc, err = broker.Connect(broker.ConnectOptions{URL: e.url, Name: "capstan dev worker",
			Creds: sf.setup.CredsPath(auth.WorkerPrincipal), Prefix: sf.setup.Prefix})
		if err != nil {
			return fail(exitFailed, "dev: %v", err)
		}
		defer wnc.Close()
		if wjs, err = jetstream.New(wnc); err != nil {
			return fail(exitFailed, "dev: %v", err)
		}
	}
	tel, stopTelemetry, err := startTelemetry(ctx, "capstan-dev", wf.metrics, e.b, log)
	if err != nil {
		return fail(exitFailed, "dev: %v", err)
	}
	defer stopTelemetry()
	if tel != nil {
		wf.observer = tel
	}
	w, err := newDemoWorker(wnc, wjs, wf, log)
	if err != nil {
		return fail(exitFailed, "dev: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	ids, err := waitServing(ctx, e.b.Catalog, done)
	if err != nil {
		return fail(exitFailed, "dev: %v", err)
	}

	natsFlag := ""
	if e.url != broker.DefaultURL {
		natsFlag = " --nats " + e.url
	}
	if sf.setup != nil {
		natsFlag += " --creds " + sf.setup.CredsPath("NAME")
		fmt.Printf("authentication: %s (principals: capstan auth list %s)\n", sf.auth, sf.auth)
	}
	fmt.Printf("capstan dev listening on %s (store %s), serving %s\n", e.url, opts.StoreDir, strings.Join(ids, ", "))
	fmt.Printf("try:\n  capstan call demo.echo%s --input '{\"hello\":\"world\"}'\n", natsFlag)

	if err := <-done; err != nil {
		return fail(exitFailed, "dev: worker: %v", err)
	}
	return exitOK
}

// waitServing waits until the catalog lists demo.echo, which the worker writes
// once it serves, and returns the ids the catalog lists.
func waitServing(ctx context.Context, catalog jetstream.KeyValue, done <-chan error) ([]string, error) {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if _, err := catalog.Get(ctx, "demo.echo"); err == nil {
			lister, err := catalog.ListKeys(ctx)
			if err != nil {
				return nil, err
			}
			var ids []string
			for id := range lister.Keys() {
				if !strings.HasPrefix(id, "_") { // a pool's liveness entry
					ids = append(ids, id)
				}
			}
			return ids, nil
		}
		select {
		case err := <-done:
			if err == nil {
				err = ctx.Err()
			}
			return nil, err
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-tick.C:
		}
	}
}
