package telemetry_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/observe"
	"github.com/capstan-dev/capstan/telemetry"
)

// Labels stay bounded: past MaxCapabilities distinct ids a capability counts
// as _other, one no worker serves as _unknown, and no execution or actor id
// is ever a label value.
func TestMetrics_LabelsBounded(t *testing.T) {
	t.Parallel()
	tel := telemetry.New(telemetry.Options{MaxCapabilities: 2})
	var ids []string
	deliver := func(capID string, known bool) {
		req := &envelope.Request{ExecutionID: envelope.NewExecutionID(), CapabilityID: capID, SubmittedAt: time.Now(),
			Actor: envelope.Actor{Kind: "user", ID: "actor-" + capID}}
		ids = append(ids, req.ExecutionID, req.Actor.ID)
		end := tel.Client().Call(context.Background(), req)
		_, x := tel.Worker().Begin(context.Background(), observe.Delivery{Request: req, Pool: "p", Worker: "w", Deliveries: 1, Known: known})
		env := &envelope.Envelope{ExecutionID: req.ExecutionID, CapabilityID: capID, Status: envelope.StatusCompleted}
		x.Finalized(env)
		x.End()
		end(env, nil)
	}
	deliver("a.one", true)
	deliver("a.two", true)
	deliver("a.three", true)
	deliver("a.three", true)
	deliver("no.such", false)

	m := scrape(t, tel.Handler())
	want := map[string]float64{"a.one": 1, "a.two": 1, "_other": 2, "_unknown": 1}
	for capID, n := range want {
		got, ok := value(m, "capstan_executions_finalized_total", "capability="+capID, "pool=p", "status=completed", "code=")
		if !ok || got != n {
			t.Errorf("finalized of %s: %v (present %v), want %v", capID, got, ok, n)
		}
	}
	for name, f := range m {
		for _, metric := range f.GetMetric() {
			for _, l := range metric.GetLabel() {
				for _, id := range ids {
					if strings.Contains(l.GetValue(), id) {
						t.Errorf("%s has the id %s in its label %s", name, id, l.GetName())
					}
				}
			}
		}
	}
}
