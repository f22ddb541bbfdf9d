package telemetry_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/capstan-dev/capstan/capstantest"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/capstan-dev/capstan/observe"
	"github.com/capstan-dev/capstan/telemetry"
)

// observers of the benchmarks: none, metrics with tracing off (no provider
// set: what a process gets when no OTEL_* variable asks for an exporter),
// and metrics with every span recorded.
func observers(b *testing.B) map[string]both {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(tracetest.NewNoopExporter()))
	b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	off, on := telemetry.New(telemetry.Options{}), telemetry.New(telemetry.Options{TracerProvider: tp})
	return map[string]both{
		"none":        {observe.NopWorker{}, observe.NopClient{}},
		"tracing-off": {off.Worker(), off.Client()},
		"tracing-on":  {on.Worker(), on.Client()},
	}
}

// both observes a worker and a client.
type both struct {
	observe.Worker
	observe.Client
}

// What one execution costs its observer: the client's call, and the worker's
// delivery with a claim, the record's write before its one attempt, the
// attempt, its finalization.
func BenchmarkObserver_PerExecution(b *testing.B) {
	for _, name := range []string{"none", "tracing-off", "tracing-on"} {
		o := observers(b)[name]
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			env := &envelope.Envelope{CapabilityID: "t.echo", Status: envelope.StatusCompleted, Attempts: 1}
			for b.Loop() {
				req := &envelope.Request{ExecutionID: "0197d2a0-0000-7000-8000-000000000001", CapabilityID: "t.echo",
					SubmittedAt: time.Now()}
				end := o.Call(context.Background(), req)
				ctx, x := o.Begin(context.Background(), observe.Delivery{Request: req, Pool: "p", Worker: "w", Deliveries: 1, Known: true})
				_, endClaim := x.Stage(ctx, observe.StageClaim)
				endClaim(nil)
				_, endStart := x.Stage(ctx, observe.StageStart)
				endStart(nil)
				_, endAttempt := x.Attempt(ctx, 1)
				endAttempt("")
				_, endFinal := x.Stage(ctx, observe.StageFinalize)
				x.Finalized(env)
				endFinal(nil)
				x.End()
				end(env, nil)
			}
		})
	}
}

// One call through a real worker on embedded JetStream, with and without
// telemetry: what a call costs end to end.
func BenchmarkCall_Observed(b *testing.B) {
	for _, name := range []string{"none", "tracing-off", "tracing-on"} {
		o := observers(b)[name]
		b.Run(name, func(b *testing.B) {
			echo := executor.Define("t.echo", executor.Meta{Description: "Returns its input.",
				Expose: executor.On(executor.SurfaceDirect), SideEffect: executor.SideEffectNone},
				func(ctx context.Context, c executor.Call[echoIn]) (echoIn, error) { return c.Input, nil })
			reg, err := executor.NewRegistry(echo)
			if err != nil {
				b.Fatal(err)
			}
			w := capstantest.Worker(b, reg, capstantest.WithConfig(executor.WorkerConfig{Observer: o}))
			c := w.Client(b, executor.ClientConfig{Actor: alice, Observer: o})
			ctx := context.Background()
			if _, err := c.Call(ctx, "t.echo", echoIn{Hello: "warm"}); err != nil { // the worker serves
				b.Fatal(err)
			}
			b.ResetTimer()
			for b.Loop() {
				e, err := c.Call(ctx, "t.echo", echoIn{Hello: "x"})
				if err != nil || e.Status != envelope.StatusCompleted {
					b.Fatalf("%v %+v", err, e)
				}
			}
		})
	}
}

// The same, with the three observers' calls interleaved on one server (one
// pool each), so that the machine's load drifts alike for all: the medians
// per call are reported as none-ns/call, tracing-off-ns/call and
// tracing-on-ns/call.
func BenchmarkCall_ObservedInterleaved(b *testing.B) {
	env := testenv.Start(b)
	obs := observers(b)
	names := []string{"none", "tracing-off", "tracing-on"}
	clients := map[string]*executor.Client{}
	ctx := context.Background()
	for _, name := range names {
		nc := env.Connect(b)
		capID := "t.echo." + strings.ReplaceAll(name, "-", "")
		echo := executor.Define(capID, executor.Meta{Description: "Returns its input.",
			Expose: executor.On(executor.SurfaceDirect), SideEffect: executor.SideEffectNone},
			func(ctx context.Context, c executor.Call[echoIn]) (echoIn, error) { return c.Input, nil })
		reg, err := executor.NewRegistry(echo)
		if err != nil {
			b.Fatal(err)
		}
		// Worker returns once the catalog lists capID, else a call may go
		// unrouted to a worker whose catalog lags.
		w := capstantest.Worker(b, reg, capstantest.WithConn(nc),
			capstantest.WithConfig(executor.WorkerConfig{Pool: strings.ReplaceAll(name, "-", ""), Observer: obs[name]}))
		c := w.Client(b, executor.ClientConfig{Actor: alice, Observer: obs[name]})
		clients[name] = c
		if _, err := c.Call(ctx, capID, echoIn{Hello: "warm"}); err != nil {
			b.Fatal(err)
		}
	}
	took := map[string][]time.Duration{}
	b.ResetTimer()
	for b.Loop() {
		for _, name := range names {
			start := time.Now()
			e, err := clients[name].Call(ctx, "t.echo."+strings.ReplaceAll(name, "-", ""), echoIn{Hello: "x"})
			took[name] = append(took[name], time.Since(start))
			if err != nil || e.Status != envelope.StatusCompleted {
				b.Fatalf("%s: %v %+v", name, err, e)
			}
		}
	}
	for _, name := range names {
		d := took[name]
		slices.Sort(d)
		b.ReportMetric(float64(d[len(d)/2].Nanoseconds()), name+"-ns/call")
	}
}
