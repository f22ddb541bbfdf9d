package telemetry_test

import (
	"context"
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/approvalstore"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/capstan-dev/capstan/observe"
	"github.com/capstan-dev/capstan/telemetry"
)

// The Grafana dashboard is built on the metrics telemetry exposes: every
// series a panel queries is in a scrape where each kind of event happened
// once, and every metric of that scrape is on a panel.
func TestDashboard_QueriesOnlyMetricsTelemetryExposes(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	nc := env.Connect(t)
	b, err := broker.Provision(ctxT(t), nc, broker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.EnsurePool(ctxT(t), broker.PoolConfig{Pool: "obs", Capabilities: []string{"t.echo"}}); err != nil {
		t.Fatal(err)
	}
	input, hash, err := approvalstore.Canonical(envelope.Raw(nil))
	if err != nil {
		t.Fatal(err)
	}
	if err := approvalstore.NewStore(b.Approvals, nil).Create(ctxT(t), &approvals.Record{ID: envelope.NewExecutionID(), CapabilityID: "t.echo",
		Actor: alice, Input: input, InputHash: hash, RequestedBy: envelope.NewExecutionID()}); err != nil {
		t.Fatal(err)
	}
	tel := telemetry.New(telemetry.Options{})
	tel.Watch(b.NC, b.Config.Prefix, time.Nanosecond)

	// Each event a worker and a client report, once.
	req := &envelope.Request{ExecutionID: envelope.NewExecutionID(), CapabilityID: "t.echo", SubmittedAt: time.Now()}
	end := tel.Client().Call(context.Background(), req)
	ctx, x := tel.Worker().Begin(context.Background(), observe.Delivery{Request: req, Pool: "obs", Worker: "w", Deliveries: 1, Known: true})
	_, endStage := x.Stage(ctx, observe.StageClaim)
	endStage(nil)
	_, endAttempt := x.Attempt(ctx, 1)
	endAttempt("")
	x.TakenOver("running")
	x.Retried(2, envelope.CodeWorkerLost)
	env1 := &envelope.Envelope{ExecutionID: req.ExecutionID, CapabilityID: "t.echo", Status: envelope.StatusFailed,
		Error: &envelope.Error{Code: envelope.CodeOutcomeUnknown}}
	x.Finalized(env1)
	x.End()
	end(env1, nil)
	refused := &envelope.Request{ExecutionID: envelope.NewExecutionID(), CapabilityID: "t.echo", SubmittedAt: time.Now()}
	tel.Client().Call(context.Background(), refused)(&envelope.Envelope{ExecutionID: refused.ExecutionID, CapabilityID: "t.echo",
		Status: envelope.StatusFailed, Error: &envelope.Error{Code: envelope.CodeQuotaExceeded, Details: map[string]any{"quota": "queuedRequests"}}}, nil)
	tel.Worker().AuditFailed()
	tel.Worker().Skipped("CAPSTAN_APPROVALS")
	tel.Worker().Paused("t.echo", "held")

	m := scrape(t, tel.Handler())
	raw, err := os.ReadFile("grafana/capstan.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	name := regexp.MustCompile(`capstan_[a-z_]+`)
	queried := map[string]bool{}
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			for _, n := range name.FindAllString(tg.Expr, -1) {
				for _, suffix := range []string{"_bucket", "_count", "_sum"} {
					n = strings.TrimSuffix(n, suffix)
				}
				queried[n] = true
				if m[n] == nil {
					t.Errorf("panel %q queries %s, which telemetry does not expose", p.Title, n)
				}
			}
		}
	}
	for n := range m {
		if strings.HasPrefix(n, "capstan_") && !queried[n] {
			t.Errorf("%s is on no panel", n)
		}
	}
}
