package telemetry_test

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/capstan-dev/capstan/telemetry"
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
		tp, shutdown, err := telemetry.TracingFromEnv(ctx, "capstan-test")
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
		if _, _, err := telemetry.TracingFromEnv(ctx, "capstan-test"); err == nil {
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
	tp, shutdown, err := telemetry.TracingFromEnv(ctx, "capstan-test")
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
