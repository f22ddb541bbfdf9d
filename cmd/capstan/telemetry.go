package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/telemetry"
	"github.com/capstan-dev/capstan/telemetry/otlp"
)

// startTelemetry gives a worker process (dev, worker) its metrics and traces:
// traces over OTLP when the OTEL_* variables ask for an exporter (the
// command chooses the exporter; package telemetry never does), metrics on
// metricsAddr's /metrics when it is set (with the pools' queues and the
// pending approvals read from b). It returns nil when neither is asked for,
// and the function that flushes and stops them.
func startTelemetry(ctx context.Context, service, metricsAddr string, b *broker.Broker, log *slog.Logger) (*telemetry.Telemetry, func(), error) {
	tp, stopTracing, err := otlp.TracingFromEnv(ctx, service)
	if err != nil {
		return nil, nil, err
	}
	stop := func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := stopTracing(sctx); err != nil {
			log.Warn("traces not flushed", "err", err)
		}
	}
	if tp == nil && metricsAddr == "" {
		return nil, stop, nil
	}
	tel := telemetry.New(telemetry.Options{TracerProvider: tp})
	if metricsAddr != "" {
		tel.Watch(b, 0)
		addr, _, err := tel.Serve(ctx, metricsAddr)
		if err != nil {
			stop()
			return nil, nil, fmt.Errorf("--metrics: %w", err)
		}
		log.Info("metrics served", "url", fmt.Sprintf("http://%s/metrics", addr))
	}
	if tp != nil {
		log.Info("traces exported over OTLP")
	}
	return tel, stop, nil
}

// clientTelemetry traces a command's calls when the OTEL_* variables ask
// for an exporter; it returns nil otherwise.
func clientTelemetry(name string) (*telemetry.Telemetry, func()) {
	tp, stopTracing, err := otlp.TracingFromEnv(context.Background(), "capstan "+name)
	if err != nil {
		fail(0, "warning: traces off: %v", err)
		return nil, func() {}
	}
	if tp == nil {
		return nil, func() {}
	}
	return telemetry.New(telemetry.Options{TracerProvider: tp}), func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = stopTracing(ctx)
	}
}
