package notifier

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Register adds the notifier's counts to reg (a telemetry.Telemetry's
// Registry), read on a scrape: capstan_notifications_sent_total,
// capstan_notifications_failed_total (given up: retries exhausted, or
// refused for good) and capstan_notification_retries_total per channel and
// kind, and capstan_notifications_in_flight. The counts are the process's
// own: sum them across notifiers. It fails when reg already has a notifier's.
func (n *Notifier) Register(reg prometheus.Registerer) error {
	return reg.Register(&collector{stats: n.Stats})
}

var (
	notifySentDesc = prometheus.NewDesc("capstan_notifications_sent_total",
		"Notifications of approvals delivered, by channel.", []string{"channel", "kind"}, nil)
	notifyFailedDesc = prometheus.NewDesc("capstan_notifications_failed_total",
		"Notifications of approvals given up (retries exhausted, or refused for good), by channel.", []string{"channel", "kind"}, nil)
	notifyRetriesDesc = prometheus.NewDesc("capstan_notification_retries_total",
		"Failed delivery attempts of notifications that were retried, by channel.", []string{"channel", "kind"}, nil)
	notifyInFlightDesc = prometheus.NewDesc("capstan_notifications_in_flight",
		"Approvals whose notifications this notifier is delivering (retries included).", nil, nil)
)

// collector reads a notifier's Stats on a scrape.
type collector struct{ stats func() Stats }

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- notifySentDesc
	ch <- notifyFailedDesc
	ch <- notifyRetriesDesc
	ch <- notifyInFlightDesc
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	s := c.stats()
	for _, cs := range s.Channels {
		ch <- prometheus.MustNewConstMetric(notifySentDesc, prometheus.CounterValue, float64(cs.Sent), cs.Name, string(cs.Kind))
		ch <- prometheus.MustNewConstMetric(notifyFailedDesc, prometheus.CounterValue, float64(cs.Failed), cs.Name, string(cs.Kind))
		ch <- prometheus.MustNewConstMetric(notifyRetriesDesc, prometheus.CounterValue, float64(cs.Retries), cs.Name, string(cs.Kind))
	}
	ch <- prometheus.MustNewConstMetric(notifyInFlightDesc, prometheus.GaugeValue, float64(s.InFlight))
}
