// Package otlp exports capstan's traces over OTLP, configured by the standard
// OTEL_* environment variables, as the capstan command does.
//
// It is apart from package telemetry on purpose: an exporter is the
// program's choice, never a library's. Package telemetry takes any
// trace.TracerProvider and links no exporter, so a program that serves only
// Prometheus metrics links neither OTLP nor gRPC; a program that imports this
// package links both OTLP exporters (HTTP and gRPC) and the OpenTelemetry SDK.
// A program that builds its own provider (another exporter, its own sampler)
// passes it to telemetry.Options and does not need this package:
//
//	tp, shutdown, err := otlp.TracingFromEnv(ctx, "payments-worker") // nil unless OTEL_* ask for OTLP
//	if err != nil { ... }
//	defer shutdown(context.Background()) // flushes the last spans
//	tel := telemetry.New(telemetry.Options{TracerProvider: tp})
package otlp
