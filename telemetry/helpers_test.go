package telemetry_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/capstan-dev/capstan/capstantest"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
)

var alice = envelope.Actor{Kind: "user", ID: "alice"}

type echoIn struct {
	Hello string `json:"hello"`
}

type flakyIn struct {
	FailTimes int `json:"failTimes"`
}

// capabilities of the workload: each ends in a known way.
func capabilities(holding chan<- struct{}) []executor.Capability {
	direct := executor.On(executor.SurfaceDirect)
	return []executor.Capability{
		executor.Define("t.echo", executor.Meta{Description: "Returns its input.", Expose: direct, SideEffect: executor.SideEffectNone},
			func(ctx context.Context, c executor.Call[echoIn]) (echoIn, error) { return c.Input, nil }),
		executor.Define("t.flaky", executor.Meta{Description: "Fails while its attempt is at most failTimes.", Expose: direct,
			SideEffect: executor.SideEffectRead, Retry: &executor.Retry{MaxAttempts: 2, Backoff: time.Millisecond}},
			func(ctx context.Context, c executor.Call[flakyIn]) (int, error) {
				if c.Attempt <= c.Input.FailTimes {
					return 0, executor.Retryable("not yet")
				}
				return c.Attempt, nil
			}),
		executor.Define("t.fail", executor.Meta{Description: "Always fails.", Expose: direct, SideEffect: executor.SideEffectNone},
			func(ctx context.Context, c executor.Call[echoIn]) (echoIn, error) {
				return echoIn{}, executor.Fail("no")
			}),
		executor.Define("t.approve", executor.Meta{Description: "Needs an approval.", Expose: direct, SideEffect: executor.SideEffectWrite,
			Approval: &executor.ApprovalRule{Required: true, Reason: "test"}},
			func(ctx context.Context, c executor.Call[echoIn]) (echoIn, error) { return c.Input, nil }),
		executor.Define("t.hold", executor.Meta{Description: "Holds until its context ends.", Expose: direct,
			SideEffect: executor.SideEffectExternal},
			func(ctx context.Context, c executor.Call[echoIn]) (echoIn, error) {
				holding <- struct{}{}
				<-ctx.Done()
				return echoIn{}, ctx.Err()
			}),
	}
}

// runWorker runs a worker until stop is called (or the test ends); stop
// returns once every delivery it took has ended.
func runWorker(t *testing.T, nc *nats.Conn, cfg executor.WorkerConfig, caps ...executor.Capability) (stop func()) {
	t.Helper()
	reg, err := executor.NewRegistry(caps...)
	if err != nil {
		t.Fatal(err)
	}
	return capstantest.Worker(t, reg, capstantest.WithConn(nc), capstantest.WithConfig(cfg)).Stop
}

func newClient(t testing.TB, nc *nats.Conn, cfg executor.ClientConfig) *executor.Client {
	t.Helper()
	cfg.Actor = alice
	c, err := executor.NewClient(nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// scrape GETs /metrics from h, as Prometheus would, and parses it.
func scrape(t *testing.T, h http.Handler) map[string]*dto.MetricFamily {
	t.Helper()
	srv := httptest.NewServer(h)
	defer srv.Close()
	res, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != http.StatusOK {
		t.Fatalf("scrape: %s\n%s", res.Status, body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil && !errors.Is(err, io.EOF) {
		t.Fatalf("scrape does not parse: %v\n%s", err, body)
	}
	return fams
}

// value is the value of the sample of family name whose labels are exactly
// labels ("k=v" pairs); a histogram's is its count. ok is false when there is
// no such sample.
func value(fams map[string]*dto.MetricFamily, name string, labels ...string) (v float64, ok bool) {
	f := fams[name]
	if f == nil {
		return 0, false
	}
	want := map[string]string{}
	for _, l := range labels {
		k, v, _ := strings.Cut(l, "=")
		want[k] = v
	}
next:
	for _, m := range f.GetMetric() {
		have := map[string]string{}
		for _, lp := range m.GetLabel() {
			have[lp.GetName()] = lp.GetValue()
		}
		for k, v := range want {
			if have[k] != v {
				continue next
			}
		}
		for k, v := range have {
			if want[k] != v {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		case m.Gauge != nil:
			return m.Gauge.GetValue(), true
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount()), true
		}
	}
	return 0, false
}

// sum adds every sample of family name (histograms: their counts).
func sum(fams map[string]*dto.MetricFamily, name string) float64 {
	var s float64
	for _, m := range fams[name].GetMetric() {
		switch {
		case m.Counter != nil:
			s += m.Counter.GetValue()
		case m.Gauge != nil:
			s += m.Gauge.GetValue()
		case m.Histogram != nil:
			s += float64(m.Histogram.GetSampleCount())
		}
	}
	return s
}
