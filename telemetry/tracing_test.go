package telemetry_test

import (
	"context"
	"strings"
	"testing"
	"unicode/utf8"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/capstan-dev/capstan/observe"
	"github.com/capstan-dev/capstan/telemetry"
)

// One call yields one connected trace: the client's span is its only root,
// and the worker's spans (queue wait, processing, claim, the attempt,
// finalization) and a span the handler starts all descend from it. The
// execution's audit events carry the trace's id.
func TestTracing_OneCallIsOneConnectedTraceFromClientToHandler(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	nc := env.Connect(t)
	ctx := ctxT(t)
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	tel := telemetry.New(telemetry.Options{TracerProvider: tp})

	allow := executor.Policy{Name: "allow", Evaluate: func(ctx context.Context, r executor.PolicyRequest) (executor.Decision, error) {
		return executor.Decision{Stance: executor.StanceAllow}, nil
	}}
	traced := executor.Define("t.traced", executor.Meta{Description: "Starts a span of its own.",
		Expose: executor.On(executor.SurfaceDirect), SideEffect: executor.SideEffectNone, Policies: []executor.Policy{allow}},
		func(ctx context.Context, c executor.Call[echoIn]) (echoIn, error) {
			_, span := tp.Tracer("handler").Start(ctx, "handler work")
			span.End()
			return c.Input, nil
		})
	stop := runWorker(t, nc, executor.WorkerConfig{Pool: "obs", Observer: tel.Worker()}, traced)
	c := newClient(t, nc, executor.ClientConfig{Observer: tel.Client()})
	e, err := c.Call(ctx, "t.traced", echoIn{Hello: "x"})
	if err != nil || e.Status != envelope.StatusCompleted {
		t.Fatalf("call: %v %+v", err, e)
	}
	stop() // every span of the delivery has ended

	got := spans.GetSpans()
	byID := map[trace.SpanID]tracetest.SpanStub{}
	names := map[string]tracetest.SpanStub{}
	for _, s := range got {
		byID[s.SpanContext.SpanID()] = s
		names[s.Name] = s
	}
	// A first delivery takes the short path: its claim is the record of
	// attempt 1, so no separate "start" span (DESIGN §14).
	for _, name := range []string{"call t.traced", "queue wait", "process t.traced", "claim", "policies", "attempt 1", "finalize", "handler work"} {
		if _, ok := names[name]; !ok {
			t.Errorf("no span %q among %d", name, len(got))
		}
	}
	root := names["call t.traced"]
	traceID := root.SpanContext.TraceID()
	var roots int
	for _, s := range got {
		if s.SpanContext.TraceID() != traceID {
			t.Errorf("span %q in trace %s, want %s", s.Name, s.SpanContext.TraceID(), traceID)
		}
		if !s.Parent.IsValid() {
			roots++
			continue
		}
		if _, ok := byID[s.Parent.SpanID()]; !ok {
			t.Errorf("span %q has a parent that is not in the trace", s.Name)
		}
	}
	if roots != 1 || root.Parent.IsValid() {
		t.Errorf("%d roots, want the client's span only", roots)
	}
	// The chain from the handler's span up to the client's.
	chain := []string{"handler work", "attempt 1", "process t.traced", "call t.traced"}
	for i := 0; i+1 < len(chain); i++ {
		if p := names[chain[i]].Parent.SpanID(); p != names[chain[i+1]].SpanContext.SpanID() {
			t.Errorf("parent of %q is %q, want %q", chain[i], byID[p].Name, chain[i+1])
		}
	}
	if p := names["queue wait"].Parent.SpanID(); p != root.SpanContext.SpanID() {
		t.Errorf("queue wait's parent is %q, want the client's span", byID[p].Name)
	}

	trail, err := c.Trail(ctx, e.ExecutionID)
	if err != nil {
		t.Fatal(err)
	}
	if len(trail) == 0 {
		t.Fatal("no audit trail")
	}
	for _, ev := range trail {
		if ev.TraceID != traceID.String() {
			t.Errorf("%s carries trace id %q, want %s", ev.Type, ev.TraceID, traceID)
		}
	}
}

// With no tracer provider set (tracing off), nothing is recorded, and a
// traceparent the caller gave is carried as it is to the audit trail.
func TestTracing_OffKeepsTheCallersTraceparent(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	nc := env.Connect(t)
	ctx := ctxT(t)
	tel := telemetry.New(telemetry.Options{})
	stop := runWorker(t, nc, executor.WorkerConfig{Pool: "obs", Observer: tel.Worker()}, capabilities(nil)[0])
	c := newClient(t, nc, executor.ClientConfig{Observer: tel.Client()})
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	e, err := c.Call(ctx, "t.echo", echoIn{}, executor.WithTraceparent(tp))
	if err != nil || e.Status != envelope.StatusCompleted {
		t.Fatalf("call: %v %+v", err, e)
	}
	stop() // a stopped worker has stored its audit events
	trail, err := c.Trail(ctx, e.ExecutionID)
	if err != nil {
		t.Fatal(err)
	}
	if len(trail) == 0 {
		t.Fatal("no audit trail")
	}
	for _, ev := range trail {
		if ev.TraceID != "4bf92f3577b34da6a3ce929d0e0e4736" {
			t.Errorf("%s carries trace id %q", ev.Type, ev.TraceID)
		}
	}
}

// A call its client does not sample still carries its trace context, marked
// not sampled: the worker follows the caller's decision and records nothing,
// rather than starting a trace of its own for every call, and the audit
// events carry the call's trace id.
func TestTracing_UnsampledCallPropagatesItsDecision(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	nc := env.Connect(t)
	ctx := ctxT(t)
	clientTP := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()))
	defer func() { _ = clientTP.Shutdown(context.Background()) }()
	spans := tracetest.NewInMemoryExporter()
	workerTP := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans)) // parent-based: samples roots
	defer func() { _ = workerTP.Shutdown(context.Background()) }()

	stop := runWorker(t, nc, executor.WorkerConfig{Pool: "obs", Observer: telemetry.New(telemetry.Options{TracerProvider: workerTP}).Worker()},
		capabilities(nil)[0])
	c := newClient(t, nc, executor.ClientConfig{Observer: telemetry.New(telemetry.Options{TracerProvider: clientTP}).Client()})
	e, err := c.Call(ctx, "t.echo", echoIn{})
	if err != nil || e.Status != envelope.StatusCompleted {
		t.Fatalf("call: %v %+v", err, e)
	}
	stop() // every span of the delivery has ended
	for _, s := range spans.GetSpans() {
		t.Errorf("the worker recorded span %q of a call its client did not sample", s.Name)
	}
	trail, err := c.Trail(ctx, e.ExecutionID)
	if err != nil {
		t.Fatal(err)
	}
	if len(trail) == 0 {
		t.Fatal("no audit trail")
	}
	for _, ev := range trail {
		if ev.TraceID == "" || ev.TraceID != trail[0].TraceID {
			t.Errorf("%s carries trace id %q, want the call's (%q)", ev.Type, ev.TraceID, trail[0].TraceID)
		}
	}
}

// A capability id no worker serves is the client's invention: it never
// names a span (a trace backend keeps span names as an index), only the
// processing span's attribute.
func TestTracing_UnknownCapabilityNamesNoSpan(t *testing.T) {
	t.Parallel()
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	tel := telemetry.New(telemetry.Options{TracerProvider: tp})
	const invented = "made.up.by-the-client.12345"
	req := &envelope.Request{ExecutionID: envelope.NewExecutionID(), CapabilityID: invented}
	ctx, x := tel.Worker().Begin(context.Background(), observe.Delivery{Request: req, Pool: "p", Worker: "w", Deliveries: 1})
	_, end := x.Stage(ctx, observe.StageClaim)
	end(nil)
	x.End()
	got := spans.GetSpans()
	if len(got) == 0 {
		t.Fatal("no span recorded")
	}
	var attr bool
	for _, s := range got {
		if strings.Contains(s.Name, invented) {
			t.Errorf("span %q is named after a capability no worker serves", s.Name)
		}
		for _, a := range s.Attributes {
			attr = attr || a.Value.AsString() == invented
		}
	}
	if !attr {
		t.Error("the capability id is on no span's attributes")
	}
}

// Nothing bounds the capability id of a request for a capability no worker
// serves but the message's size, nor makes it UTF-8: what a span keeps of it
// is at most an id's length, so that a client cannot make each span it
// causes hold a megabyte until it is exported, and valid UTF-8, without
// which an OTLP export of the batch fails.
func TestTracing_UnknownCapabilityIDBoundedOnTheSpan(t *testing.T) {
	t.Parallel()
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	tel := telemetry.New(telemetry.Options{TracerProvider: tp})
	huge := "a\xff" + strings.Repeat("x", 1<<20)
	req := &envelope.Request{ExecutionID: envelope.NewExecutionID(), CapabilityID: huge}
	_, x := tel.Worker().Begin(context.Background(), observe.Delivery{Request: req, Pool: "p", Worker: "w", Deliveries: 1})
	x.End()
	got := spans.GetSpans()
	if len(got) == 0 {
		t.Fatal("no span recorded")
	}
	for _, s := range got {
		if len(s.Name) > envelope.MaxIDLen+len("process ") {
			t.Errorf("span name of %d bytes", len(s.Name))
		}
		for _, a := range s.Attributes {
			if n := len(a.Value.String()); n > envelope.MaxIDLen {
				t.Errorf("span %q: attribute %s of %d bytes, want at most %d", s.Name, a.Key, n, envelope.MaxIDLen)
			}
			if !utf8.ValidString(a.Value.String()) {
				t.Errorf("span %q: attribute %s is not UTF-8", s.Name, a.Key)
			}
		}
	}
}
