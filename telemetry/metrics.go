package telemetry

import (
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// Label values that stand for many: a capability no worker serves, and any
// capability past MaxCapabilities distinct ones.
const (
	UnknownCapability = "_unknown"
	OtherCapability   = "_other"
)

// metrics are the collectors of one Telemetry.
type metrics struct {
	finalized      *prometheus.CounterVec
	attempts       *prometheus.CounterVec
	retries        *prometheus.CounterVec
	takeovers      *prometheus.CounterVec
	limited        *prometheus.CounterVec
	slots          *prometheus.GaugeVec
	outcomeUnknown *prometheus.CounterVec
	recovered      *prometheus.CounterVec
	auditFailures  prometheus.Counter
	skipped        *prometheus.CounterVec
	quotaExceeded  *prometheus.CounterVec
	handler        *prometheus.HistogramVec
	execution      *prometheus.HistogramVec
	queueWait      *prometheus.HistogramVec
	stage          *prometheus.HistogramVec
	inFlight       *prometheus.GaugeVec

	clientCalls    *prometheus.CounterVec
	clientQuota    *prometheus.CounterVec
	clientDuration *prometheus.HistogramVec
}

// durationBuckets cover a fast in-memory handler (a millisecond) to a long
// external call (two minutes).
var durationBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120}

func newMetrics(r prometheus.Registerer) *metrics {
	capPool := []string{"capability", "pool"}
	m := &metrics{
		finalized: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "capstan_executions_finalized_total",
			Help: "Envelopes this worker created, by capability, pool, status and error code (empty when completed).",
		}, []string{"capability", "pool", "status", "code"}),
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "capstan_attempts_total",
			Help: "Handler attempts started.",
		}, capPool),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "capstan_retries_total",
			Help: "Attempts started after a failed one, by the previous attempt's error code (WORKER_LOST after a takeover).",
		}, []string{"capability", "pool", "previous_code"}),
		takeovers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "capstan_takeovers_total",
			Help: "Executions taken over from a lost worker, by the state its record was in.",
		}, []string{"capability", "pool", "from_state"}),
		limited: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "capstan_limited_total",
			Help: "Executions a limit of their capability held back, by the limit's kind and what they did (wait, refuse, approval).",
		}, []string{"capability", "pool", "kind", "action"}),
		slots: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "capstan_limit_slots_held",
			Help: "Concurrency slots this worker's executions hold; summed over the workers, a capability's occupancy.",
		}, []string{"capability", "pool"}),
		outcomeUnknown: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "capstan_outcome_unknown_total",
			Help: "Executions finalized OUTCOME_UNKNOWN: their worker was lost during an attempt that may not be repeated.",
		}, capPool),
		recovered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "capstan_executions_recovered_total",
			Help: "Executions finalized completed from what a lost or stopped attempt left, by how: its receipt, or its reconciler's finding.",
		}, []string{"capability", "pool", "how"}),
		auditFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "capstan_audit_publish_failures_total",
			Help: "Audit events JetStream did not store.",
		}),
		skipped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "capstan_records_skipped_total",
			Help: "Records a listing skipped because they do not decode, by bucket (each is logged with its key).",
		}, []string{"bucket"}),
		quotaExceeded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "capstan_quota_exceeded_total",
			Help: "Requests refused QUOTA_EXCEEDED because their principal was over a quota, by quota and principal.",
		}, []string{"quota", "principal"}),
		handler: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "capstan_handler_duration_seconds",
			Help:    "Duration of one handler attempt.",
			Buckets: durationBuckets,
		}, capPool),
		execution: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "capstan_execution_duration_seconds",
			Help:    "From the request's submission (JetStream storing it, by the server's clock) to its envelope, as the finalizing worker sees it.",
			Buckets: durationBuckets,
		}, []string{"capability", "pool", "status"}),
		queueWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "capstan_queue_wait_seconds",
			Help:    "From the request's submission (JetStream storing it, by the server's clock) to its first delivery to a worker.",
			Buckets: durationBuckets,
		}, capPool),
		stage: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "capstan_stage_duration_seconds",
			Help:    "Duration of the pipeline's stages that wait on I/O: claim, policies, approval, start, audit, finalize.",
			Buckets: durationBuckets,
		}, []string{"stage", "pool"}),
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "capstan_executions_in_flight",
			Help: "Deliveries this worker is working on.",
		}, capPool),
		clientCalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "capstan_client_requests_total",
			Help: "Requests this client submitted, by capability and outcome: the envelope's status, submitted (not awaited) or error (transport).",
		}, []string{"capability", "outcome"}),
		clientQuota: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "capstan_client_quota_exceeded_total",
			Help: "Requests of this client refused QUOTA_EXCEEDED, by the quota its principal was over.",
		}, []string{"quota"}),
		clientDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "capstan_client_call_duration_seconds",
			Help:    "End to end, as the caller sees it: from submitting a request to receiving its envelope.",
			Buckets: durationBuckets,
		}, []string{"capability", "status"}),
	}
	r.MustRegister(m.finalized, m.attempts, m.retries, m.takeovers, m.limited, m.slots, m.outcomeUnknown, m.recovered, m.auditFailures, m.skipped, m.quotaExceeded,
		m.handler, m.execution, m.queueWait, m.stage, m.inFlight, m.clientCalls, m.clientQuota, m.clientDuration)
	return m
}

// capabilities bounds the capability label: past max distinct ids, any new
// one is OtherCapability, so that a caller inventing ids cannot grow a
// scrape without end.
type capabilities struct {
	max  int
	n    atomic.Int64
	seen sync.Map
}

func (c *capabilities) label(id string) string {
	if _, ok := c.seen.Load(id); ok {
		return id
	}
	if c.n.Load() >= int64(c.max) {
		return OtherCapability
	}
	if _, loaded := c.seen.LoadOrStore(id, struct{}{}); !loaded {
		c.n.Add(1)
	}
	return id
}
