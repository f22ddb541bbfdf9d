package otlp

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// TracingFromEnv returns a tracer provider configured by the standard
// OpenTelemetry environment variables, and the function that flushes and
// stops it.
//
// Nothing is exported, and the provider is nil (telemetry.Options'
// "tracing off"), unless
// OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or
// OTEL_TRACES_EXPORTER=otlp is set; OTEL_TRACES_EXPORTER=none and
// OTEL_SDK_DISABLED=true turn it off whatever else is set. The exporter is
// OTLP over HTTP (protobuf), or gRPC when OTEL_EXPORTER_OTLP_PROTOCOL (or
// OTEL_EXPORTER_OTLP_TRACES_PROTOCOL) is "grpc"; the exporters read their
// other OTEL_EXPORTER_OTLP_* variables (headers, timeout, TLS) themselves,
// the SDK reads OTEL_TRACES_SAMPLER and its argument, and OTEL_SERVICE_NAME
// and OTEL_RESOURCE_ATTRIBUTES override service, the default service name.
func TracingFromEnv(ctx context.Context, service string) (trace.TracerProvider, func(context.Context) error, error) {
	off := func(context.Context) error { return nil }
	exporter := strings.ToLower(strings.TrimSpace(os.Getenv("OTEL_TRACES_EXPORTER")))
	if strings.EqualFold(os.Getenv("OTEL_SDK_DISABLED"), "true") || exporter == "none" {
		return nil, off, nil
	}
	switch exporter {
	case "":
		if os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
			return nil, off, nil
		}
	case "otlp":
	default:
		return nil, nil, fmt.Errorf("capstan: OTEL_TRACES_EXPORTER=%s: only otlp and none are supported", exporter)
	}
	protocol := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if protocol == "" {
		protocol = os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	var exp sdktrace.SpanExporter
	var err error
	switch protocol {
	case "", "http/protobuf":
		exp, err = otlptracehttp.New(ctx)
	case "grpc":
		exp, err = otlptracegrpc.New(ctx)
	default:
		return nil, nil, fmt.Errorf("capstan: OTLP protocol %q: want http/protobuf or grpc", protocol)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("capstan: OTLP trace exporter: %w", err)
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(attribute.String("service.name", service)))
	if err == nil {
		var env *resource.Resource
		env, err = resource.New(ctx, resource.WithFromEnv())
		if err == nil {
			res, err = resource.Merge(res, env)
		}
	}
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, nil, fmt.Errorf("capstan: trace resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return tp, tp.Shutdown, nil
}

// SetTracingFromEnv makes TracingFromEnv's provider, when there is one,
// OpenTelemetry's global provider (for the process's own spans), and returns
// it with its shutdown.
func SetTracingFromEnv(ctx context.Context, service string) (trace.TracerProvider, func(context.Context) error, error) {
	tp, shutdown, err := TracingFromEnv(ctx, service)
	if err != nil {
		return nil, nil, err
	}
	if tp != nil {
		otel.SetTracerProvider(tp)
	}
	return tp, shutdown, nil
}
