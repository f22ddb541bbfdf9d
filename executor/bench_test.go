package executor

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/broker"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/testenv"
)

type benchIn struct {
	Data string `json:"data"`
}

// benchWorker is a worker that never touches NATS: it has no broker and no
// audit emitter, so what it runs is the governance alone.
func benchWorker(b *testing.B, policies []Policy, capPolicies []Policy) (*Worker, *binding) {
	b.Helper()
	reg, err := NewRegistry(Define("bench.noop", Meta{
		Description: "Returns its input.", Expose: On(SurfaceDirect), SideEffect: None, Policies: capPolicies,
	}, func(ctx context.Context, c Call[benchIn]) (benchIn, error) { return c.Input, nil }))
	if err != nil {
		b.Fatal(err)
	}
	w := &Worker{reg: reg, cfg: WorkerConfig{ID: "bench", Policies: policies, Logger: slog.New(slog.DiscardHandler)}.withDefaults()}
	w.log = w.cfg.Logger
	w.base, w.baseCancel = context.WithCancelCause(context.Background())
	b.Cleanup(func() { w.baseCancel(nil) })
	return w, reg.get("bench.noop")
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
		return Decision{Stance: Allow}, nil
	}}
	for _, bc := range []struct {
		name             string
		global, own      []Policy
		wantPolicyCalled bool
	}{
		{name: "no-policies"},
		{name: "two-policies", global: []Policy{allow}, own: []Policy{allow}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			w, bind := benchWorker(b, bc.global, bc.own)
			data := benchRequest(b)
			b.ReportAllocs()
			for b.Loop() {
				governOnce(b, w, bind, data)
			}
		})
	}
}

func governOnce(b *testing.B, w *Worker, bind *binding, data []byte) {
	req, err := envelope.DecodeRequest(data)
	if err != nil {
		b.Fatal(err)
	}
	x := &execution{w: w, req: req, b: bind, start: time.Now(), done: make(chan struct{})}
	x.ctx, x.cancel = context.WithCancelCause(w.base)
	defer x.cancel(nil)
	if x.inputHash, err = envelope.InputHash(req.Input); err != nil {
		b.Fatal(err)
	}
	now := time.Now().UTC()
	rec := &Record{V: envelope.Version, ExecutionID: req.ExecutionID, CapabilityID: req.CapabilityID, State: StateClaimed,
		Worker: w.cfg.ID, LeaseUntil: now.Add(w.cfg.Lease), CreatedAt: now, UpdatedAt: now}
	mustMarshal(b, rec)
	mustMarshal(b, x.event(audit.Requested, nil))
	if !x.admit() {
		b.Fatal("refused")
	}
	rec.State, rec.Attempt, rec.StartedAt = StateRunning, 1, time.Now().UTC()
	mustMarshal(b, rec)
	mustMarshal(b, x.event(audit.Started, map[string]any{"attempt": 1, "approvalId": ""}))
	out, cerr := x.attempt(1, time.Second)
	if cerr != nil {
		b.Fatal(cerr)
	}
	raw, cerr := x.checkOutput(out)
	if cerr != nil {
		b.Fatal(cerr)
	}
	env := &envelope.Envelope{V: envelope.Version, ExecutionID: req.ExecutionID, CapabilityID: req.CapabilityID,
		Status: envelope.StatusCompleted, Output: raw, Attempts: 1, FinalizedBy: w.cfg.ID, FinalizedAt: time.Now().UTC()}
	mustMarshal(b, x.event(audit.Completed, map[string]any{"attempts": 1, "durationMs": int64(0)}))
	mustMarshal(b, env)
	rec.State, rec.Status = StateFinalized, env.Status
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
		if _, err := broker.Create(ctx, br.Envelopes, e.ExecutionID, e); err != nil {
			b.Fatal(err)
		}
	}
}
