package otlp_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"

	"github.com/capstan-dev/capstan/telemetry/otlp"
)

// Without OTEL_* variables asking for an exporter there is no provider and
// nothing is exported; with an OTLP endpoint, spans reach it over HTTP.
func TestTracingFromEnv_ExportsOnlyWhenAskedTo(t *testing.T) {
	var posts atomic.Int64
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == "/v1/traces" {
			posts.Add(1)
		}
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	defer collector.Close()
	for _, k := range []string{"OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT",
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"} {
		t.Setenv(k, "")
	}
	ctx := ctxT(t)

	off := []map[string]string{
		{},
		{"OTEL_EXPORTER_OTLP_ENDPOINT": collector.URL, "OTEL_TRACES_EXPORTER": "none"},
		{"OTEL_EXPORTER_OTLP_ENDPOINT": collector.URL, "OTEL_SDK_DISABLED": "true"},
	}
	for _, env := range off {
		for k, v := range env {
			t.Setenv(k, v)
		}
		tp, shutdown, err := otlp.TracingFromEnv(ctx, "capstan-test")
		if err != nil || tp != nil {
			t.Fatalf("%v: provider %v, err %v; want none", env, tp, err)
		}
		if err := shutdown(ctx); err != nil {
			t.Fatal(err)
		}
		for k := range env {
			t.Setenv(k, "")
		}
	}

	for _, env := range []map[string]string{{"OTEL_TRACES_EXPORTER": "zipkin"}, {"OTEL_EXPORTER_OTLP_ENDPOINT": collector.URL,
		"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}} {
		for k, v := range env {
			t.Setenv(k, v)
		}
		if _, _, err := otlp.TracingFromEnv(ctx, "capstan-test"); err == nil {
			t.Errorf("%v: no error", env)
		}
		for k := range env {
			t.Setenv(k, "")
		}
	}
	if posts.Load() != 0 {
		t.Fatalf("%d exports while tracing was off", posts.Load())
	}

	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.URL)
	tp, shutdown, err := otlp.TracingFromEnv(ctx, "capstan-test")
	if err != nil || tp == nil {
		t.Fatalf("provider %v, err %v", tp, err)
	}
	_, span := tp.Tracer("test").Start(ctx, "one")
	span.End()
	if err := shutdown(ctx); err != nil { // flushes
		t.Fatal(err)
	}
	if posts.Load() == 0 {
		t.Fatal("the span never reached the OTLP endpoint")
	}
}

// OTEL_EXPORTER_OTLP_PROTOCOL=grpc exports over gRPC.
func TestTracingFromEnv_GRPCWhenAskedFor(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	collector := &traceCollector{}
	srv := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(srv, collector)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	for k, v := range map[string]string{"OTEL_SDK_DISABLED": "", "OTEL_TRACES_EXPORTER": "",
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "",
		"OTEL_EXPORTER_OTLP_ENDPOINT": "http://" + lis.Addr().String(), "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
		"OTEL_EXPORTER_OTLP_INSECURE": "true"} {
		t.Setenv(k, v)
	}
	ctx := ctxT(t)
	tp, shutdown, err := otlp.TracingFromEnv(ctx, "capstan-test")
	if err != nil || tp == nil {
		t.Fatalf("provider %v, err %v", tp, err)
	}
	_, span := tp.Tracer("test").Start(ctx, "one")
	span.End()
	if err := shutdown(ctx); err != nil { // flushes
		t.Fatal(err)
	}
	if got := collector.spans.Load(); got != 1 {
		t.Fatalf("the gRPC collector received %d spans, want 1", got)
	}
}

// traceCollector counts the spans exported to it over gRPC.
type traceCollector struct {
	coltracepb.UnimplementedTraceServiceServer
	spans atomic.Int64
}

func (c *traceCollector) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	for _, rs := range req.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			c.spans.Add(int64(len(ss.Spans)))
		}
	}
	return &coltracepb.ExportTraceServiceResponse{}, nil
}
