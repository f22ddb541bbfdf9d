package main

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"
)

// With OTEL_EXPORTER_OTLP_ENDPOINT set, `capstan dev` and `capstan call`
// export their spans over OTLP, each under its own service name, and one
// call is one trace from the command's span to the worker's.
func TestDevAndCall_ExportTracesOverOTLPWhenTheVariablesSaySo(t *testing.T) {
	col := &otlpCollector{services: map[string]map[string]string{}}
	srv := httptest.NewServer(col)
	defer srv.Close()
	for k, v := range map[string]string{"OTEL_SDK_DISABLED": "", "OTEL_TRACES_EXPORTER": "",
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "", "OTEL_EXPORTER_OTLP_PROTOCOL": "",
		"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "", "OTEL_SERVICE_NAME": "", "OTEL_RESOURCE_ATTRIBUTES": "",
		"OTEL_EXPORTER_OTLP_ENDPOINT": srv.URL, "OTEL_BSP_SCHEDULE_DELAY": "100"} {
		t.Setenv(k, v) // the children inherit them
	}
	port := freePort(t)
	d := startDaemon(t, "capstan call demo.echo", nil, "dev", "--store", t.TempDir(),
		"--listen", fmt.Sprintf("127.0.0.1:%d", port), "--console", "off")
	stdout, stderr, code := capstan(t, fmt.Sprintf("nats://127.0.0.1:%d", port), "call", "-o", "json", "demo.echo", "--input", `{"hello":"world"}`)
	if code != exitOK {
		t.Fatalf("call: exit %d, stderr %s", code, stderr)
	}
	id := decode[printedEnvelope](t, stdout).ExecutionID
	if !strings.Contains(d.out.String(), "traces exported over OTLP") {
		t.Errorf("dev did not say it exports traces:\n%s", d.out.String())
	}

	deadline := time.Now().Add(guard)
	for {
		callTrace, processTrace := col.trace("capstan call", "call demo.echo"), col.trace("capstan-dev", "process demo.echo")
		if callTrace != "" && processTrace != "" {
			if callTrace != processTrace {
				t.Fatalf("execution %s: the call's trace %s, the worker's %s", id, callTrace, processTrace)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("execution %s: spans received by service: %v", id, col.seen())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// otlpCollector receives OTLP over HTTP and keeps, by service name, the
// trace id of each span name.
type otlpCollector struct {
	mu       sync.Mutex
	services map[string]map[string]string
}

func (c *otlpCollector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	var req coltracepb.ExportTraceServiceRequest
	if err != nil || r.URL.Path != "/v1/traces" || proto.Unmarshal(body, &req) != nil {
		http.Error(w, "not an OTLP trace export", http.StatusBadRequest)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rs := range req.ResourceSpans {
		service := ""
		for _, a := range rs.GetResource().GetAttributes() {
			if a.Key == "service.name" {
				service = a.GetValue().GetStringValue()
			}
		}
		if c.services[service] == nil {
			c.services[service] = map[string]string{}
		}
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				c.services[service][s.Name] = fmt.Sprintf("%x", s.TraceId)
			}
		}
	}
	w.Header().Set("Content-Type", "application/x-protobuf")
}

func (c *otlpCollector) trace(service, span string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.services[service][span]
}

func (c *otlpCollector) seen() map[string][]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string][]string{}
	for service, spans := range c.services {
		for name := range spans {
			out[service] = append(out[service], name)
		}
	}
	return out
}
