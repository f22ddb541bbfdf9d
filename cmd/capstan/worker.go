package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/capstan-dev/capstan/internal/testhooks"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/demo"
	"github.com/capstan-dev/capstan/observe"
)

// workerFlags configure the demo worker of dev and worker.
type workerFlags struct {
	pool         string
	concurrency  int
	lease        time.Duration
	grace        time.Duration
	strictAudit  bool
	auditUnacked bool
	id           string
	replicas     int
	recordWindow time.Duration
	sweepEvery   time.Duration
	// wait bounds how long a worker's start waits for the cluster (0: no bound).
	wait time.Duration
	// capabilities, comma-separated, is the part of the demo catalog served
	// (worker only); empty serves it all.
	capabilities string
	// metrics is where /metrics is served (empty: nowhere).
	metrics string
	// observer, when set, observes the worker (metrics and traces).
	observer observe.Worker
	// notify names a notifier's configuration file: the worker runs one
	// beside itself (empty: none).
	notify string
}

func addWorkerFlags(fs *flag.FlagSet) *workerFlags {
	f := &workerFlags{}
	fs.StringVar(&f.pool, "pool", "default", "worker pool `name`")
	fs.IntVar(&f.concurrency, "concurrency", 64, "executions run at once")
	fs.DurationVar(&f.lease, "lease", 30*time.Second, "how long a claim holds without renewal")
	fs.DurationVar(&f.grace, "grace", 30*time.Second, "how long a shutdown waits for in-flight executions")
	fs.BoolVar(&f.strictAudit, "strict-audit", false, "fail an execution whose capability.started event is not stored")
	fs.BoolVar(&f.auditUnacked, "audit-unacked", false, "publish audit events without JetStream's acknowledgement (one server message fewer per execution; a refused event goes uncounted)")
	fs.StringVar(&f.id, "id", "", "worker id in records, envelopes and audit (default host-pid-random)")
	fs.StringVar(&f.metrics, "metrics", "", "serve Prometheus metrics on http://`HOST:PORT`/metrics (traces: the OTEL_* variables)")
	fs.DurationVar(&f.sweepEvery, "sweep-every", 30*time.Second, "how often the worker holding the sweeping lease ends requests no worker started by their deadline (negative: never)")
	fs.DurationVar(&f.recordWindow, "record-window", 0, "how long an execution's record is kept after its last write: one per deployment, recorded by its first worker (0: the deployment's, 15m for a new one); a worker set to another refuses to start")
	fs.StringVar(&f.notify, "notify", "", "also run a notifier of approvals with this configuration `file` (see capstan notify)")
	fs.IntVar(&f.replicas, "replicas", 0, "replicas of the streams and buckets it creates: 0 is auto (3 in a cluster of three or more, else 1); existing ones keep theirs, see 'capstan admin replicas'")
	return f
}

// newDemoWorker returns a worker serving the demo catalog, or the part of it
// f names, its effects kept in js.
func newDemoWorker(nc *nats.Conn, js jetstream.JetStream, f *workerFlags, log *slog.Logger) (*executor.Worker, []string, error) {
	caps := demo.Catalog(js)
	if f.capabilities != "" {
		byID := map[string]executor.Capability{}
		for _, c := range caps {
			byID[c.ID()] = c
		}
		caps = nil
		for _, id := range strings.Split(f.capabilities, ",") {
			c, ok := byID[strings.TrimSpace(id)]
			if !ok {
				return nil, nil, fmt.Errorf("--capabilities: the demo catalog has no %q", strings.TrimSpace(id))
			}
			caps = append(caps, c)
		}
	}
	reg, err := executor.NewRegistry(caps...)
	if err != nil {
		return nil, nil, err
	}
	w, err := executor.NewWorker(nc, reg, testhooks.Worker(executor.WorkerConfig{
		Pool: f.pool, Concurrency: f.concurrency, Lease: f.lease, Grace: f.grace,
		StrictAudit: f.strictAudit, ID: f.id, Logger: log, Deployment: executor.Deployment{Replicas: f.replicas, RecordWindow: f.recordWindow},
		Observer:    f.observer,
		StartupWait: f.wait, SweepInterval: f.sweepEvery,
	}, testhooks.WorkerKnobs{AuditUnacknowledged: f.auditUnacked}))
	return w, reg.IDs(), err
}

func runWorker(args []string) int {
	fs := newFlags("worker", "[--pool NAME] [--capabilities ID,ID] [--concurrency N] [--lease D] [--grace D] [--strict-audit] [--replicas N] [--metrics HOST:PORT] [--notify FILE]")
	conn := addConnFlags(fs)
	wf := addWorkerFlags(fs)
	fs.StringVar(&wf.capabilities, "capabilities", "", "serve only these demo capabilities, comma-separated (default: all)")
	fs.DurationVar(&wf.wait, "wait", 0, "how long to wait for the servers to be reachable and the cluster ready, retrying with a log line (0: until stopped)")
	if _, code, ok := parseFlags(fs, args, 0); !ok {
		return code
	}
	notifyCfg, err := loadNotify(wf.notify)
	if err != nil {
		return usageError("%v", err)
	}
	log := newLogger(slog.LevelInfo)
	ctx, stop := signalContext()
	defer stop()
	start := time.Now()
	nc, err := conn.connectWait(ctx, "worker", wf.wait, log)
	if err != nil {
		if ctx.Err() != nil {
			return exitOK
		}
		return usageError("%v", err)
	}
	defer nc.Close()

	var js jetstream.JetStream
	for try := 0; ; try++ {
		pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		js, err = demo.Provision(pctx, nc, wf.replicas)
		cancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return exitOK
		}
		if !broker.Unreachable(err) || (wf.wait > 0 && time.Since(start) > wf.wait) {
			return usageError("%v", err)
		}
		log.Warn("waiting for the cluster: demo provisioning failed; retrying", "err", err)
		select {
		case <-ctx.Done():
			return exitOK
		case <-time.After(time.Second):
		}
	}
	if wf.wait > 0 {
		// What is left of the bound applies to the worker's own start.
		wf.wait = max(wf.wait-time.Since(start), time.Millisecond)
	}
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	b, err := broker.Provision(pctx, nc, broker.Config{Replicas: wf.replicas})
	cancel()
	if err != nil {
		return usageError("%v", err)
	}
	tel, stopTelemetry, err := startTelemetry(ctx, "capstan-worker", wf.metrics, b, log)
	if err != nil {
		return usageError("%v", err)
	}
	defer stopTelemetry()
	if tel != nil {
		wf.observer = tel.Worker()
	}
	w, _, err := newDemoWorker(nc, js, wf, log)
	if err != nil {
		return usageError("%v", err)
	}
	ran := make(chan error, 1)
	go func() { ran <- w.Run(ctx) }()
	stopNotifier, err := startNotifier(ctx, nc, notifyCfg, tel, log)
	if err != nil {
		return usageError("--notify: %v", err)
	}
	defer stopNotifier()
	stopped, gone := make(chan struct{}), make(chan struct{})
	defer close(stopped)
	go closeWhenServerGone(ctx, stopped, gone, nc, log)
	select {
	case err = <-ran:
	case <-gone:
		// Whatever is left talks to a closed connection, or retries a
		// write no server will answer: it is abandoned as a crash's is.
		select {
		case err = <-ran:
		case <-time.After(serverGoneAfter):
			return fail(exitFailed, "worker: stopped with its server out of reach; executions in flight are left to a takeover")
		}
	}
	if err != nil {
		return fail(exitFailed, "worker: %v", err)
	}
	return exitOK
}

// serverGoneAfter is how long a stopping worker waits for its connection to
// come back before it gives up on its server.
const serverGoneAfter = time.Second

// closeWhenServerGone closes nc, then gone, once the worker is stopping (ctx
// ended) and its server has been out of reach for serverGoneAfter, until
// stopped. The shutdown's last words to the server (draining the pulls,
// releasing the sweeping lease, flushing the audit trail) then fail at once
// instead of each waiting out its timeout; executions still in flight are
// abandoned as a crash's are, to a takeover once their lease expires.
func closeWhenServerGone(ctx context.Context, stopped <-chan struct{}, gone chan<- struct{}, nc *nats.Conn, log *slog.Logger) {
	select {
	case <-ctx.Done():
	case <-stopped:
		return
	}
	t := time.NewTicker(serverGoneAfter / 10)
	defer t.Stop()
	var since time.Time
	for {
		switch {
		case nc.IsConnected():
			since = time.Time{}
		case since.IsZero():
			since = time.Now()
		case time.Since(since) >= serverGoneAfter:
			log.Warn("stopping with the server out of reach: closing the connection; executions in flight are left to a takeover")
			nc.Close()
			close(gone)
			return
		}
		select {
		case <-stopped:
			return
		case <-t.C:
		}
	}
}
