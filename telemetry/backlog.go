package telemetry

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/internal/approvalstore"
	"github.com/capstan-dev/capstan/internal/broker"
)

// Watch adds the metrics read from the deployment of the given prefix
// (default "CAPSTAN") over nc on a scrape: each pool's queue
// (requests pending delivery, delivered but unacknowledged, age of the
// oldest, over every principal's queue), each principal's queue (requests
// and bytes held, and the limits its quotas set) and the approvals pending
// per capability. What was read is kept for
// cacheFor (default 5 s) so that frequent scrapes, or many workers scraped at
// once, do not each list the approvals bucket. The values are the broker's,
// not the process's: every process that watches reports the same ones, so a
// query combines them with max, never sum (as the dashboard does), or one
// process per deployment watches. nc must be allowed to read every stream
// and bucket (a worker's or an admin's); until they exist, a scrape reports
// the error.
func (t *Telemetry) Watch(nc *nats.Conn, prefix string, cacheFor time.Duration) {
	if cacheFor <= 0 {
		cacheFor = 5 * time.Second
	}
	t.reg.MustRegister(&brokerCollector{t: t, nc: nc, prefix: prefix, cacheFor: cacheFor, caps: &t.caps})
}

var (
	pendingDesc          = desc("capstan_pool_pending_requests", "Requests stored in the pool's queue and not yet delivered to a worker.", "pool")
	unackedDesc          = desc("capstan_pool_unacknowledged_requests", "Requests delivered to the pool's workers and not yet acknowledged (running or buffered).", "pool")
	oldestDesc           = desc("capstan_pool_oldest_request_age_seconds", "Age of the oldest request of the pool not yet acknowledged (0 when there is none).", "pool")
	approvalsDesc        = desc("capstan_approvals_pending", "Approvals waiting for a decision, by capability.", "capability")
	queueRequestsDesc    = desc("capstan_queue_requests", "Requests in the principal's queue, not yet ended (its queuedRequests quota counts them).", "principal")
	queueBytesDesc       = desc("capstan_queue_bytes", "Bytes of the requests in the principal's queue (its queuedBytes quota counts them).", "principal")
	queueMaxRequestsDesc = desc("capstan_queue_max_requests", "Requests the principal's queue may hold; a submit beyond is refused QUOTA_EXCEEDED (-1: no bound).", "principal")
	queueMaxBytesDesc    = desc("capstan_queue_max_bytes", "Bytes the principal's queue may hold; a submit beyond is refused QUOTA_EXCEEDED (-1: no bound).", "principal")
)

// desc describes one of the collector's metrics, by one label.
func desc(name, help, label string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, []string{label}, nil)
}

type brokerCollector struct {
	t      *Telemetry
	nc     *nats.Conn
	prefix string
	// b and approvals are opened at the first scrape that finds them.
	b         *broker.Broker
	approvals *approvalstore.Store
	cacheFor  time.Duration
	caps      *capabilities

	mu       sync.Mutex
	read     time.Time
	backlogs []broker.Backlog
	queues   []broker.QueueUsage
	pending  map[string]int
	errs     []error
}

func (c *brokerCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- pendingDesc
	ch <- unackedDesc
	ch <- oldestDesc
	ch <- approvalsDesc
	ch <- queueRequestsDesc
	ch <- queueBytesDesc
	ch <- queueMaxRequestsDesc
	ch <- queueMaxBytesDesc
}

func (c *brokerCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	if now.Sub(c.read) >= c.cacheFor {
		c.refresh()
		c.read = time.Now()
	}
	for _, bl := range c.backlogs {
		ch <- prometheus.MustNewConstMetric(pendingDesc, prometheus.GaugeValue, float64(bl.Pending), bl.Pool)
		ch <- prometheus.MustNewConstMetric(unackedDesc, prometheus.GaugeValue, float64(bl.AckPending), bl.Pool)
		age := 0.0
		if !bl.Oldest.IsZero() {
			age = max(now.Sub(bl.Oldest), 0).Seconds()
		}
		ch <- prometheus.MustNewConstMetric(oldestDesc, prometheus.GaugeValue, age, bl.Pool)
	}
	for _, q := range c.queues {
		ch <- prometheus.MustNewConstMetric(queueRequestsDesc, prometheus.GaugeValue, float64(q.Requests), q.Principal)
		ch <- prometheus.MustNewConstMetric(queueBytesDesc, prometheus.GaugeValue, float64(q.Bytes), q.Principal)
		ch <- prometheus.MustNewConstMetric(queueMaxRequestsDesc, prometheus.GaugeValue, float64(q.MaxRequests), q.Principal)
		ch <- prometheus.MustNewConstMetric(queueMaxBytesDesc, prometheus.GaugeValue, float64(q.MaxBytes), q.Principal)
	}
	for capID, n := range c.pending {
		ch <- prometheus.MustNewConstMetric(approvalsDesc, prometheus.GaugeValue, float64(n), capID)
	}
	for _, err := range c.errs {
		ch <- prometheus.NewInvalidMetric(pendingDesc, err)
	}
}

// refresh reads the backlogs and the pending approvals; what fails is left
// out of the scrape and reported as its error.
func (c *brokerCollector) refresh() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c.errs = c.errs[:0]
	if c.b == nil {
		b, err := broker.OpenAll(ctx, c.nc, broker.Config{Prefix: c.prefix})
		if err != nil {
			c.errs = append(c.errs, err)
			return
		}
		c.b = b
		c.approvals = approvalstore.NewStore(b.Approvals, nil).OnSkipped(func(string, error) { c.t.skipped(b.Names.ApprovalsBucket()) })
	}
	bl, err := c.b.Backlogs(ctx)
	if err != nil {
		c.errs = append(c.errs, err)
	}
	c.backlogs = bl
	qs, err := c.b.QueueUsages(ctx)
	if err != nil {
		c.errs = append(c.errs, err)
	}
	c.queues = qs
	list, err := c.approvals.List(ctx, approvalstore.Filter{Status: approvals.StatusPending})
	if err != nil {
		c.errs = append(c.errs, err)
	}
	c.pending = map[string]int{}
	for _, r := range list {
		c.pending[c.caps.label(r.CapabilityID)]++
	}
}
