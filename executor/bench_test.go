package executor

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/execution"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor/internal/engine"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/policies"
	"github.com/capstan-dev/capstan/internal/procstat"
	"github.com/capstan-dev/capstan/internal/testenv"
)

type benchIn struct {
	Data string `json:"data"`
}

// benchWorker is a worker that never touches NATS: it has no broker and no
// audit emitter, so what it runs is the governance alone.
func benchWorker(b *testing.B, policies []Policy, capPolicies []Policy) (*Worker, *capability) {
	b.Helper()
	reg, err := NewRegistry(Define("bench.noop", Meta{
		Description: "Returns its input.", Expose: On(SurfaceDirect), SideEffect: SideEffectNone, Policies: capPolicies,
	}, func(ctx context.Context, c Call[benchIn]) (benchIn, error) { return c.Input, nil }))
	if err != nil {
		b.Fatal(err)
	}
	w := &Worker{reg: reg, cfg: WorkerConfig{ID: "bench", Policies: policies, Logger: slog.New(slog.DiscardHandler)}.withDefaults()}
	w.log = w.cfg.Logger
	c := newCapability(reg.get("bench.noop"), w)
	w.caps = map[string]*capability{"bench.noop": c}
	w.run = engine.NewRunner(nil, w.log, engine.Config{ID: w.cfg.ID, Lease: w.cfg.Lease,
		Capabilities: map[string]engine.Definition{"bench.noop": c}})
	b.Cleanup(w.run.Stop)
	return w, w.caps["bench.noop"]
}

func benchRequest(b *testing.B) []byte {
	b.Helper()
	req := envelope.Request{
		V: envelope.Version, ExecutionID: envelope.NewExecutionID(), CapabilityID: "bench.noop",
		Input: envelope.MustRaw(map[string]any{"data": "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}),
		Actor: envelope.Actor{Kind: envelope.ActorService, ID: "bench"}, Surface: string(SurfaceDirect), SubmittedAt: time.Now().UTC(),
	}
	data, err := envelope.Marshal(&req)
	if err != nil {
		b.Fatal(err)
	}
	return data
}

// BenchmarkGovernanceStages runs what a worker does for one execution apart
// from the broker's round trips, around a handler that returns its input:
// decode the request, hash the input for the trail, stages 4–9, the attempt,
// stages 12–13, and the encoding of every record, envelope and audit event
// the broker would then carry (three record writes, one envelope, three
// events).
func BenchmarkGovernanceStages(b *testing.B) {
	allow := Policy{Name: "allow", Evaluate: func(context.Context, PolicyRequest) (Decision, error) {
		return Decision{Stance: StanceAllow}, nil
	}}
	tenRules, err := policies.Compile("ten.cedar", []byte(benchCedar))
	if err != nil {
		b.Fatal(err)
	}
	tenRules.Version = 1
	for _, bc := range []struct {
		name             string
		global, own      []Policy
		wantPolicyCalled bool
		cedar            *policies.Set
	}{
		{name: "no-policies"},
		{name: "two-policies", global: []Policy{allow}, own: []Policy{allow}},
		{name: "cedar-ten-rules", cedar: tenRules},
	} {
		b.Run(bc.name, func(b *testing.B) {
			w, bind := benchWorker(b, bc.global, bc.own)
			if bc.cedar != nil {
				w.policies = policies.Fixed(bc.cedar)
			}
			data := benchRequest(b)
			b.ReportAllocs()
			cpu := procstat.CPU()
			for b.Loop() {
				governOnce(b, w, bind, data)
			}
			// The process's CPU time per execution (the collector's
			// included): steadier than the wall clock on a shared machine.
			b.ReportMetric(float64(procstat.CPU()-cpu)/float64(b.N), "cpu-ns/op")
		})
	}
}

// benchCedar is a Cedar set of ten policies, as a deployment might hold:
// one permit, nine forbids on the principal, the actor, the capability's
// attributes, the surface and the input, none of which matches the bench's
// call.
const benchCedar = `
@id("everyone") permit (principal, action in Action::"call", resource);
@id("no-destructive-from-mcp") forbid (principal, action, resource) when { context.surface == "mcp" && resource.sideEffect == "destructive" };
@id("contractors-no-payments") forbid (principal, action, resource) when { principal.hasTag("team") && principal.getTag("team") == "contractors" && resource.tags.contains("payments") };
@id("beta-nothing") forbid (principal in Principal::"beta", action, resource);
@id("mallory-nothing") forbid (principal == User::"mallory", action, resource);
@id("anonymous-reads-only") forbid (principal is Anonymous, action, resource) when { resource.sideEffect != "none" && resource.sideEffect != "read" };
@id("agents-no-high-risk") forbid (principal is Agent, action, resource) when { resource.risk == "high" };
@id("bots-no-external") forbid (principal, action, resource) when { principal.hasTag("kind") && principal.getTag("kind") == "bot" && resource.sideEffect == "external" };
@id("no-secrets-in-data") forbid (principal, action == Action::"bench.noop", resource) when { context.input.data like "*password*" };
@id("no-empty-data") forbid (principal, action == Action::"bench.noop", resource) when { context.input.data == "" };
`

func governOnce(b *testing.B, w *Worker, c *capability, data []byte) {
	req, err := envelope.DecodeRequest(data)
	if err != nil {
		b.Fatal(err)
	}
	inputHash, err := envelope.InputHash(req.Input)
	if err != nil {
		b.Fatal(err)
	}
	event := func(typ string, data map[string]any) *audit.Event {
		return &audit.Event{Type: typ, Surface: req.Surface, Actor: audit.ActorOf(req.Actor), ExecutionID: req.ExecutionID,
			CapabilityID: req.CapabilityID, CorrelationID: req.CorrelationID, InputHash: inputHash, Data: data, Worker: w.cfg.ID}
	}
	now := time.Now().UTC()
	rec := &execution.Record{V: envelope.Version, ExecutionID: req.ExecutionID, CapabilityID: req.CapabilityID, State: execution.StateClaimed,
		Worker: w.cfg.ID, LeaseUntil: now.Add(w.cfg.Lease), CreatedAt: now, UpdatedAt: now}
	mustMarshal(b, rec)
	mustMarshal(b, event(audit.EventRequested, nil))
	adm := c.Admit(w.run.Context(), engine.Request{Request: req, Principal: broker.Anonymous})
	if adm.Unit == nil {
		b.Fatal("refused")
	}
	unit := adm.Unit
	rec.State, rec.Attempt, rec.StartedAt = execution.StateRunning, 1, time.Now().UTC()
	mustMarshal(b, rec)
	mustMarshal(b, event(audit.EventStarted, unit.Started(1)))
	ctx, cancel := context.WithTimeout(w.run.Context(), time.Second)
	out, err := unit.Work(ctx, engine.Attempt{N: 1, Logger: w.log})
	cancel()
	if err != nil {
		b.Fatal(err)
	}
	raw, cerr := unit.Output(out)
	if cerr != nil {
		b.Fatal(cerr)
	}
	env := &envelope.Envelope{V: envelope.Version, ExecutionID: req.ExecutionID, CapabilityID: req.CapabilityID,
		Status: envelope.StatusCompleted, Output: raw, Attempts: 1, FinalizedBy: w.cfg.ID, FinalizedAt: time.Now().UTC()}
	mustMarshal(b, event(audit.EventCompleted, map[string]any{"attempts": 1, "durationMs": int64(0)}))
	mustMarshal(b, env)
	rec.State, rec.Status = execution.StateFinalized, env.Status
	mustMarshal(b, rec)
}

func mustMarshal(b *testing.B, v any) {
	if _, err := envelope.Marshal(v); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkFinalize measures the create-only envelope write on an embedded
// server: one round trip, the one every execution ends with.
func BenchmarkFinalize(b *testing.B) {
	env := testenv.Start(b)
	nc := env.Connect(b)
	ctx := context.Background()
	br, err := broker.Provision(ctx, nc, broker.Config{})
	if err != nil {
		b.Fatal(err)
	}
	out := envelope.MustRaw(map[string]any{"data": "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"})
	b.ReportAllocs()
	for b.Loop() {
		e := &envelope.Envelope{V: envelope.Version, ExecutionID: envelope.NewExecutionID(), CapabilityID: "bench.noop",
			Status: envelope.StatusCompleted, Output: out, Attempts: 1, FinalizedBy: "bench", FinalizedAt: time.Now().UTC()}
		if _, err := broker.Create(ctx, br.Envelopes, broker.Key(broker.Anonymous, e.ExecutionID), e); err != nil {
			b.Fatal(err)
		}
	}
}
