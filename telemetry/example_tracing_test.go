package telemetry_test

import (
	"context"
	"fmt"
	"slices"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/telemetry"
)

// Traces go to the program's own TracerProvider, with the exporter the
// program chose: here one that keeps the spans in memory (a program would
// export them, over OTLP with telemetry/otlp or otherwise). One call is one
// trace, from the client's span to the worker's attempt.
func Example_tracing() {
	url, stopServer := exampleServer()
	defer stopServer()
	ctx, stop := context.WithCancel(context.Background())

	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	tel := telemetry.New(telemetry.Options{TracerProvider: tp})

	hello := executor.Define("greet.hello", executor.Meta{
		Description: "Greets someone by name.",
		Expose:      executor.On(executor.SurfaceDirect),
		SideEffect:  executor.SideEffectNone,
	}, func(ctx context.Context, call executor.Call[string]) (string, error) {
		return "Hello, " + call.Input + "!", nil
	})
	reg, err := executor.NewRegistry(hello)
	check(err)
	nc, err := executor.Connect(executor.ConnectOptions{URL: url})
	check(err)
	w, err := executor.NewWorker(nc, reg, executor.WorkerConfig{Pool: "greeters", Observer: tel.Worker()})
	check(err)
	done := make(chan error)
	go func() { done <- w.Run(ctx) }()
	c, err := executor.NewClient(nc, executor.ClientConfig{Observer: tel.Client()})
	check(err)
	env, err := c.Call(ctx, "greet.hello", "Ada", executor.As(envelope.Actor{Kind: envelope.ActorUser, ID: "ada"}))
	check(err)
	fmt.Println(env.Status)
	check(c.Close())
	stop()
	check(<-done) // every span of the delivery has ended
	nc.Close()

	var names []string
	traces := map[string]bool{}
	for _, s := range spans.GetSpans() {
		names = append(names, s.Name)
		traces[s.SpanContext.TraceID().String()] = true
	}
	slices.Sort(names)
	fmt.Println(len(traces), "trace:", names)
	check(tp.Shutdown(context.Background())) // a program's flushes its exporter
	// Output:
	// completed
	// 1 trace: [attempt 1 call greet.hello claim finalize process greet.hello queue wait]
}
