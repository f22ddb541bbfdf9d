package telemetry

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/observe"
)

// Options configure a Telemetry. Zero values are the defaults.
type Options struct {
	// Registry receives the metrics. Default: a new registry with the Go
	// runtime's and the process's collectors, served by Handler.
	Registry *prometheus.Registry
	// TracerProvider starts the spans: the program's own, with the exporter
	// it chose (otlp.TracingFromEnv's, say), or otel.GetTracerProvider() to
	// use the global one. Default: none, and no span is started: tracing off
	// costs nothing beyond the metrics.
	TracerProvider trace.TracerProvider
	// MaxCapabilities bounds the distinct values of the capability label
	// (default 1000); past it, new ids count as "_other".
	MaxCapabilities int
}

// Telemetry turns what workers and clients report into Prometheus metrics and
// OpenTelemetry spans: set its Worker as executor.WorkerConfig.Observer and
// its Client as executor.ClientConfig.Observer. One Telemetry may serve every
// worker and client of a process.
type Telemetry struct {
	reg    *prometheus.Registry
	m      *metrics
	tracer trace.Tracer // nil: tracing off
	prop   propagation.TraceContext
	caps   capabilities
}

// Worker is what a worker reports to (executor.WorkerConfig.Observer).
func (t *Telemetry) Worker() observe.Worker { return workerObserver{t} }

// Client is what a client reports to (executor.ClientConfig.Observer).
func (t *Telemetry) Client() observe.Client { return clientObserver{t} }

// workerObserver and clientObserver turn a worker's and a client's reports
// into t's metrics and spans.
type (
	workerObserver struct{ t *Telemetry }
	clientObserver struct{ t *Telemetry }
)

// New registers capstan's metrics with opts.Registry (or a registry of its
// own) and returns the Telemetry that updates them.
func New(opts Options) *Telemetry {
	if opts.Registry == nil {
		opts.Registry = prometheus.NewRegistry()
		opts.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	if opts.MaxCapabilities <= 0 {
		opts.MaxCapabilities = 1000
	}
	t := &Telemetry{reg: opts.Registry, m: newMetrics(opts.Registry)}
	if opts.TracerProvider != nil {
		t.tracer = opts.TracerProvider.Tracer("github.com/capstan-dev/capstan")
	}
	t.caps.max = opts.MaxCapabilities
	return t
}

// Registry is the registry the metrics are in.
func (t *Telemetry) Registry() *prometheus.Registry { return t.reg }

// Handler serves the registry in Prometheus' exposition format (mount it on
// /metrics). A collector that fails (a broker that does not answer) leaves
// its metrics out of the scrape; the others are served.
func (t *Telemetry) Handler() http.Handler {
	return promhttp.HandlerFor(t.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

// parent is the context a request's traceparent continues, under ctx.
func (t *Telemetry) parent(ctx context.Context, traceparent string) context.Context {
	if traceparent == "" {
		return ctx
	}
	return t.prop.Extract(ctx, propagation.MapCarrier{"traceparent": traceparent})
}

// Call starts the client's span of one request and puts its trace context in
// the request.
func (o clientObserver) Call(ctx context.Context, req *envelope.Request) func(*envelope.Envelope, error) {
	t := o.t
	// A resume naming only its approval: the worker reads the capability.
	capLabel := unknownCapability
	if req.CapabilityID != "" {
		capLabel = t.caps.label(req.CapabilityID)
	}
	span := noSpan
	if t.tracer != nil {
		if !trace.SpanContextFromContext(ctx).IsValid() {
			ctx = t.parent(ctx, req.Traceparent)
		}
		ctx, span = t.tracer.Start(ctx, "call "+capLabel, trace.WithSpanKind(trace.SpanKindProducer))
		if span.IsRecording() {
			span.SetAttributes(attribute.String("capstan.capability_id", req.CapabilityID),
				attribute.String("capstan.execution_id", req.ExecutionID))
		}
		// A span not sampled is propagated too, marked so: the worker follows
		// the caller's decision instead of starting a trace of its own.
		if span.SpanContext().IsValid() {
			carrier := propagation.MapCarrier{}
			t.prop.Inject(ctx, carrier)
			req.Traceparent = carrier["traceparent"]
		}
	}
	start := time.Now()
	return func(env *envelope.Envelope, err error) {
		defer span.End()
		t.countQuota(env, err)
		switch {
		case err != nil:
			t.m.clientCalls.WithLabelValues(capLabel, "error").Inc()
			if span.IsRecording() {
				span.SetStatus(codes.Error, err.Error())
			}
		case env == nil:
			t.m.clientCalls.WithLabelValues(capLabel, "submitted").Inc()
		default:
			status := string(env.Status)
			t.m.clientCalls.WithLabelValues(capLabel, status).Inc()
			t.m.clientDuration.WithLabelValues(capLabel, status).Observe(time.Since(start).Seconds())
			if span.IsRecording() {
				setOutcome(span, env)
			}
		}
	}
}

// countQuota counts a refusal over a quota: an envelope, or a submit's
// error, saying QUOTA_EXCEEDED.
func (t *Telemetry) countQuota(env *envelope.Envelope, err error) {
	var details map[string]any
	var cerr *envelope.CapabilityError
	switch {
	case errors.As(err, &cerr) && cerr.Code == envelope.CodeQuotaExceeded:
		details = cerr.Details
	case env != nil && env.Error != nil && env.Error.Code == envelope.CodeQuotaExceeded:
		details = env.Error.Details
	default:
		return
	}
	quota, _ := details["quota"].(string)
	switch quota {
	case envelope.QuotaQueuedRequests, envelope.QuotaQueuedBytes, envelope.QuotaPendingApprovals, envelope.QuotaControlPerSecond:
	default:
		quota = "other" // a label a caller cannot grow
	}
	t.m.clientQuota.WithLabelValues(quota).Inc()
}

// AuditFailed counts an audit event JetStream did not store.
func (o workerObserver) AuditFailed() { o.t.m.auditFailures.Inc() }

// Paused counts a call an operator's pause held or refused.
func (o workerObserver) Paused(capabilityID, action string) {
	t := o.t
	t.m.paused.WithLabelValues(t.caps.label(capabilityID), action).Inc()
}

// Skipped counts a record of bucket a listing skipped because it does not
// decode. Buckets are capstan's few: the label stays small.
func (o workerObserver) Skipped(bucket string) { o.t.skipped(bucket) }

func (t *Telemetry) skipped(bucket string) { t.m.skipped.WithLabelValues(bucket).Inc() }

// QuotaExceeded counts a request refused because principal was over quota.
// Principals are the deployment's grants, so the label stays bounded.
func (o workerObserver) QuotaExceeded(quota, principal string) {
	t := o.t
	t.m.quotaExceeded.WithLabelValues(quota, principal).Inc()
}

// Begin continues the request's trace with a span for its queue wait (on its
// first delivery) and one for the worker's processing.
func (o workerObserver) Begin(ctx context.Context, d observe.Delivery) (context.Context, observe.Execution) {
	t := o.t
	req := d.Request
	// The server's clock, when known: the request's own time is the client's.
	submitted := d.Stored
	if submitted.IsZero() {
		submitted = req.SubmittedAt
	}
	x := &execution{t: t, pool: d.Pool, capLabel: unknownCapability, start: time.Now(), submitted: submitted}
	if d.Known {
		x.capLabel = t.caps.label(req.CapabilityID)
	}
	first := d.Deliveries <= 1
	if first && !submitted.IsZero() {
		t.m.queueWait.WithLabelValues(x.capLabel, x.pool).Observe(max(x.start.Sub(submitted), 0).Seconds())
	}
	x.inFlight = t.m.inFlight.WithLabelValues(x.capLabel, x.pool)
	x.inFlight.Inc()
	if t.tracer == nil {
		x.span = noSpan
		return ctx, x
	}
	ctx = t.parent(ctx, req.Traceparent)
	if first && !submitted.IsZero() && trace.SpanContextFromContext(ctx).IsValid() {
		_, q := t.tracer.Start(ctx, "queue wait", trace.WithTimestamp(submitted), trace.WithSpanKind(trace.SpanKindInternal))
		q.End(trace.WithTimestamp(x.start))
	}
	// The span's name is the bounded label: a capability no worker serves is
	// an id the client made up, kept only as an attribute.
	ctx, x.span = t.tracer.Start(ctx, "process "+x.capLabel, trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithTimestamp(x.start))
	if x.span.IsRecording() {
		capID := req.CapabilityID
		if !d.Known {
			// Only the message's size bounds an id no worker serves, and
			// nothing makes it UTF-8, which an OTLP export requires.
			capID = strings.ToValidUTF8(capID[:min(len(capID), envelope.MaxIDLen)], "?")
		}
		x.span.SetAttributes(attribute.String("capstan.capability_id", capID),
			attribute.String("capstan.execution_id", req.ExecutionID),
			attribute.String("capstan.pool", d.Pool), attribute.String("capstan.worker", d.Worker),
			attribute.Int("capstan.delivery", d.Deliveries))
	}
	return ctx, x
}

// execution observes one delivery.
type execution struct {
	t         *Telemetry
	span      trace.Span
	pool      string
	capLabel  string
	start     time.Time
	submitted time.Time
	inFlight  prometheus.Gauge
}

func (x *execution) Stage(ctx context.Context, name string) (context.Context, func(error)) {
	start := time.Now()
	span := noSpan
	if x.t.tracer != nil {
		ctx, span = x.t.tracer.Start(ctx, name)
	}
	return ctx, func(err error) {
		x.t.m.stage.WithLabelValues(name, x.pool).Observe(time.Since(start).Seconds())
		if err != nil && span.IsRecording() {
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}
}

func (x *execution) Attempt(ctx context.Context, n int) (context.Context, func(envelope.Code)) {
	x.t.m.attempts.WithLabelValues(x.capLabel, x.pool).Inc()
	start := time.Now()
	span := noSpan
	if x.t.tracer != nil {
		ctx, span = x.t.tracer.Start(ctx, "attempt "+strconv.Itoa(n))
		if span.IsRecording() {
			span.SetAttributes(attribute.Int("capstan.attempt", n))
		}
	}
	return ctx, func(code envelope.Code) {
		x.t.m.handler.WithLabelValues(x.capLabel, x.pool).Observe(time.Since(start).Seconds())
		if code != "" && span.IsRecording() {
			span.SetStatus(codes.Error, string(code))
		}
		span.End()
	}
}

func (x *execution) Retried(n int, previous envelope.Code) {
	x.t.m.retries.WithLabelValues(x.capLabel, x.pool, string(previous)).Inc()
	if x.span.IsRecording() {
		x.span.AddEvent("retried", trace.WithAttributes(attribute.Int("capstan.attempt", n),
			attribute.String("capstan.previous_code", string(previous))))
	}
}

func (x *execution) TakenOver(from string) {
	x.t.m.takeovers.WithLabelValues(x.capLabel, x.pool, from).Inc()
	if x.span.IsRecording() {
		x.span.AddEvent("taken over", trace.WithAttributes(attribute.String("capstan.from_state", from)))
	}
}

func (x *execution) Limited(kind, action string) {
	x.t.m.limited.WithLabelValues(x.capLabel, x.pool, kind, action).Inc()
	if x.span.IsRecording() {
		x.span.AddEvent("limited", trace.WithAttributes(attribute.String("capstan.limit", kind),
			attribute.String("capstan.at_limit", action)))
	}
}

func (x *execution) Slot(held bool) {
	if held {
		x.t.m.slots.WithLabelValues(x.capLabel, x.pool).Inc()
	} else {
		x.t.m.slots.WithLabelValues(x.capLabel, x.pool).Dec()
	}
}

func (x *execution) Finalized(env *envelope.Envelope) {
	code := ""
	if env.Error != nil {
		code = string(env.Error.Code)
	}
	status := string(env.Status)
	x.t.m.finalized.WithLabelValues(x.capLabel, x.pool, status, code).Inc()
	if env.Error != nil && env.Error.Code == envelope.CodeOutcomeUnknown {
		x.t.m.outcomeUnknown.WithLabelValues(x.capLabel, x.pool).Inc()
	}
	if env.Recovered != nil {
		x.t.m.recovered.WithLabelValues(x.capLabel, x.pool, env.Recovered.How).Inc()
	}
	since := x.start
	if !x.submitted.IsZero() {
		since = x.submitted
	}
	x.t.m.execution.WithLabelValues(x.capLabel, x.pool, status).Observe(max(time.Since(since), 0).Seconds())
	if x.span.IsRecording() {
		setOutcome(x.span, env)
	}
}

func (x *execution) End() {
	x.inFlight.Dec()
	x.span.End()
}

// noSpan stands for the span of a Telemetry without tracing.
var noSpan = trace.SpanFromContext(context.Background())

// setOutcome puts an envelope's outcome on a span.
func setOutcome(span trace.Span, env *envelope.Envelope) {
	span.SetAttributes(attribute.String("capstan.status", string(env.Status)),
		attribute.Int("capstan.attempts", env.Attempts))
	if env.Error != nil {
		span.SetAttributes(attribute.String("capstan.error_code", string(env.Error.Code)))
		if env.Status == envelope.StatusFailed {
			span.SetStatus(codes.Error, string(env.Error.Code))
		}
	}
}
