package main

import (
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// `capstan dev --metrics` serves /metrics with the counts of the calls it
// ran, and logs one info line per execution outcome, with the execution's
// id, capability, status, attempts and duration, and nothing of its input or
// output.
func TestDev_MetricsAndOneLogLinePerOutcome(t *testing.T) {
	t.Parallel()
	port, metricsPort := freePort(t), freePort(t)
	d := startDaemon(t, "capstan call demo.echo", nil, "dev", "--store", t.TempDir(),
		"--listen", fmt.Sprintf("127.0.0.1:%d", port), "--metrics", fmt.Sprintf("127.0.0.1:%d", metricsPort))
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)

	var ids []string
	for _, call := range [][]string{
		{"call", "demo.echo", "--input", `{"hello":"secret-input-1"}`},
		{"call", "demo.echo", "--input", `{"hello":"secret-input-2"}`},
		{"call", "demo.flaky", "--input", `{"failTimes":1}`},
	} {
		stdout, stderr, code := capstan(t, url, append(call, "-o", "json")...)
		if code != exitOK {
			t.Fatalf("%v: exit %d, stderr %s", call, code, stderr)
		}
		ids = append(ids, decode[printedEnvelope](t, stdout).ExecutionID)
	}

	// The log line follows the envelope; the metrics are updated before it.
	finalized := regexp.MustCompile(`(?m)^.*msg="execution finalized".*$`)
	deadline := time.Now().Add(guard)
	for len(finalized.FindAllString(d.out.String(), -1)) < len(ids) {
		if time.Now().After(deadline) {
			t.Fatalf("no finalized line for every execution:\n%s", d.out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	lines := finalized.FindAllString(d.out.String(), -1)
	if len(lines) != len(ids) {
		t.Fatalf("%d finalized lines for %d executions:\n%s", len(lines), len(ids), strings.Join(lines, "\n"))
	}
	for i, id := range ids {
		var line string
		for _, l := range lines {
			if strings.Contains(l, "executionId="+id) {
				line = l
			}
		}
		attempts := "attempts=1"
		if i == 2 {
			attempts = "attempts=2"
		}
		for _, want := range []string{"level=INFO", "status=completed", attempts, "durationMs=", "capabilityId=demo."} {
			if !strings.Contains(line, want) {
				t.Errorf("line of %s lacks %q: %q", id, want, line)
			}
		}
	}
	if strings.Contains(d.out.String(), "secret-input") {
		t.Errorf("an input reached the logs:\n%s", d.out.String())
	}

	res, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort))
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(res.Body)
	_ = res.Body.Close()
	if err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("scrape: %v %s", err, res.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("scrape does not parse: %v", err)
	}
	counter := func(name string, labels map[string]string) float64 {
	next:
		for _, m := range fams[name].GetMetric() {
			for _, l := range m.GetLabel() {
				if labels[l.GetName()] != l.GetValue() {
					continue next
				}
			}
			return m.GetCounter().GetValue()
		}
		return -1
	}
	if got := counter("capstan_executions_finalized_total", map[string]string{"capability": "demo.echo", "pool": "default",
		"status": "completed", "code": ""}); got != 2 {
		t.Errorf("demo.echo completed: %v, want 2", got)
	}
	if got := counter("capstan_attempts_total", map[string]string{"capability": "demo.flaky", "pool": "default"}); got != 2 {
		t.Errorf("demo.flaky attempts: %v, want 2", got)
	}
	if fams["capstan_pool_pending_requests"] == nil {
		t.Error("no pool backlog in the scrape")
	}
	if code := d.stop(t); code != exitOK {
		t.Fatalf("dev exit %d", code)
	}
}
