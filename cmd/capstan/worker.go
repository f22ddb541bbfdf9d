package main

import (
	"context"
	"flag"
	"log/slog"
	"time"

	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/demo"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// workerFlags configure the demo worker of dev and worker.
type workerFlags struct {
	pool        string
	concurrency int
	lease       time.Duration
	grace       time.Duration
	strictAudit bool
	id          string
}

func addWorkerFlags(fs *flag.FlagSet) *workerFlags {
	f := &workerFlags{}
	fs.StringVar(&f.pool, "pool", "default", "worker pool `name`")
	fs.IntVar(&f.concurrency, "concurrency", 64, "executions run at once")
	fs.DurationVar(&f.lease, "lease", 30*time.Second, "how long a claim holds without renewal")
	fs.DurationVar(&f.grace, "grace", 30*time.Second, "how long a shutdown waits for in-flight executions")
	fs.BoolVar(&f.strictAudit, "strict-audit", false, "fail an execution whose capability.started event is not stored")
	fs.StringVar(&f.id, "id", "", "worker id in records, envelopes and audit (default host-pid-random)")
	return f
}

// newDemoWorker returns a worker serving the demo catalog, its effects kept in js.
func newDemoWorker(nc *nats.Conn, js jetstream.JetStream, f *workerFlags, log *slog.Logger) (*executor.Worker, error) {
	reg, err := executor.NewRegistry(demo.Catalog(js)...)
	if err != nil {
		return nil, err
	}
	return executor.NewWorker(nc, reg, executor.WorkerConfig{
		Pool: f.pool, Concurrency: f.concurrency, Lease: f.lease, Grace: f.grace,
		StrictAudit: f.strictAudit, ID: f.id, Logger: log,
	})
}

func runWorker(args []string) int {
	fs := newFlags("worker", "[--pool NAME] [--concurrency N] [--lease D] [--grace D] [--strict-audit]")
	conn := addConnFlags(fs)
	wf := addWorkerFlags(fs)
	if _, code, ok := parseFlags(fs, args, 0); !ok {
		return code
	}
	log := newLogger(slog.LevelInfo)
	nc, err := conn.connect("worker")
	if err != nil {
		return usageError("%v", err)
	}
	defer nc.Close()
	ctx, stop := signalContext()
	defer stop()

	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	js, err := demo.Provision(pctx, nc, 1)
	cancel()
	if err != nil {
		return usageError("%v", err)
	}
	w, err := newDemoWorker(nc, js, wf, log)
	if err != nil {
		return usageError("%v", err)
	}
	if err := w.Run(ctx); err != nil {
		return fail(exitFailed, "worker: %v", err)
	}
	return exitOK
}
