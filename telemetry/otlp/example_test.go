package otlp_test

import (
	"context"
	"log"
	"net/http"

	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/telemetry"
	"github.com/capstan-dev/capstan/telemetry/otlp"
)

// A worker process with Prometheus metrics and traces over OTLP, as
// docs/operations.md shows it (its lines are these). Compiled, not run: it
// serves until it is stopped.
func Example_workerMetricsAndTraces() {
	ctx := context.Background()
	check := func(err error) {
		if err != nil {
			log.Fatal(err)
		}
	}
	nc, err := executor.Connect(executor.ConnectOptions{URL: "nats://127.0.0.1:4222"})
	check(err)
	reg, err := executor.NewRegistry() // the payments capabilities
	check(err)

	tp, shutdown, err := otlp.TracingFromEnv(ctx, "payments-worker") // package telemetry/otlp; nil unless OTEL_* ask for OTLP
	tel := telemetry.New(telemetry.Options{TracerProvider: tp})      // any TracerProvider, or none: metrics only
	tel.Watch(nc, "", 0)                                             // queues and pending approvals, read on a scrape (one process per deployment)
	w, err := executor.NewWorker(nc, reg, executor.WorkerConfig{Pool: "payments", Observer: tel.Worker()})
	http.Handle("/metrics", tel.Handler())

	check(err)
	defer func() { check(shutdown(context.Background())) }() // flushes the last spans
	go func() { check(http.ListenAndServe("127.0.0.1:9090", nil)) }()
	check(w.Run(ctx))
}
