package telemetry

import (
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// Label values that stand for many: a capability no worker serves, and any
// capability past MaxCapabilities distinct ones.
const (
	unknownCapability = "_unknown"
	otherCapability   = "_other"
)

// metrics are the collectors of one Telemetry.
type metrics struct {
	finalized      *prometheus.CounterVec
	attempts       *prometheus.CounterVec
	retries        *prometheus.CounterVec
	takeovers      *prometheus.CounterVec
	limited        *prometheus.CounterVec
	paused         *prometheus.CounterVec
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
		finalized:      counterVec("capstan_executions_finalized_total", "Envelopes this worker created, by capability, pool, status and error code (empty when completed).", "capability", "pool", "status", "code"),
		attempts:       counterVec("capstan_attempts_total", "Handler attempts started.", capPool...),
		retries:        counterVec("capstan_retries_total", "Attempts started after a failed one, by the previous attempt's error code (WORKER_LOST after a takeover).", "capability", "pool", "previous_code"),
		takeovers:      counterVec("capstan_takeovers_total", "Executions taken over from a lost worker, by the state its record was in.", "capability", "pool", "from_state"),
		limited:        counterVec("capstan_limited_total", "Executions a limit of their capability held back, by the limit's kind and what they did (wait, refuse, approval).", "capability", "pool", "kind", "action"),
		paused:         counterVec("capstan_paused_total", "Calls an operator's pause stopped, by what became of them: held (a delivery put back to wait in its queue, again at each delivery while the pause lasts) or refused (ended PAUSED).", "capability", "action"),
		slots:          gaugeVec("capstan_limit_slots_held", "Concurrency slots this worker's executions hold; summed over the workers, a capability's occupancy.", "capability", "pool"),
		outcomeUnknown: counterVec("capstan_outcome_unknown_total", "Executions finalized OUTCOME_UNKNOWN: their worker was lost during an attempt that may not be repeated.", capPool...),
		recovered:      counterVec("capstan_executions_recovered_total", "Executions finalized completed from what a lost or stopped attempt left, by how: its receipt, or its reconciler's finding.", "capability", "pool", "how"),
		auditFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "capstan_audit_publish_failures_total",
			Help: "Audit events JetStream did not store.",
		}),
		skipped:        counterVec("capstan_records_skipped_total", "Records a listing skipped because they do not decode, by bucket (each is logged with its key).", "bucket"),
		quotaExceeded:  counterVec("capstan_quota_exceeded_total", "Requests refused QUOTA_EXCEEDED because their principal was over a quota, by quota and principal.", "quota", "principal"),
		handler:        durationVec("capstan_handler_duration_seconds", "Duration of one handler attempt.", capPool...),
		execution:      durationVec("capstan_execution_duration_seconds", "From the request's submission (JetStream storing it, by the server's clock) to its envelope, as the finalizing worker sees it.", "capability", "pool", "status"),
		queueWait:      durationVec("capstan_queue_wait_seconds", "From the request's submission (JetStream storing it, by the server's clock) to its first delivery to a worker.", capPool...),
		stage:          durationVec("capstan_stage_duration_seconds", "Duration of the pipeline's stages that wait on I/O: claim, policies, approval, start, audit, finalize.", "stage", "pool"),
		inFlight:       gaugeVec("capstan_executions_in_flight", "Deliveries this worker is working on.", capPool...),
		clientCalls:    counterVec("capstan_client_requests_total", "Requests this client submitted, by capability and outcome: the envelope's status, submitted (not awaited) or error (transport).", "capability", "outcome"),
		clientQuota:    counterVec("capstan_client_quota_exceeded_total", "Requests of this client refused QUOTA_EXCEEDED, by the quota its principal was over.", "quota"),
		clientDuration: durationVec("capstan_client_call_duration_seconds", "End to end, as the caller sees it: from submitting a request to receiving its envelope.", "capability", "status"),
	}
	r.MustRegister(m.finalized, m.attempts, m.retries, m.takeovers, m.limited, m.paused, m.slots, m.outcomeUnknown, m.recovered, m.auditFailures, m.skipped, m.quotaExceeded,
		m.handler, m.execution, m.queueWait, m.stage, m.inFlight, m.clientCalls, m.clientQuota, m.clientDuration)
	return m
}

// counterVec, gaugeVec and durationVec make one of the worker's or the
// client's metrics: its name, its help and its labels.
func counterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
}

func gaugeVec(name, help string, labels ...string) *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)
}

func durationVec(name, help string, labels ...string) *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: durationBuckets}, labels)
}

// capabilities bounds the capability label: past max distinct ids, any new
// one is otherCapability, so that a caller inventing ids cannot grow a
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
		return otherCapability
	}
	if _, loaded := c.seen.LoadOrStore(id, struct{}{}); !loaded {
		c.n.Add(1)
	}
	return id
}
