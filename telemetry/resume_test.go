package telemetry_test

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/auth"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/approvalsrpc"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/capstan-dev/capstan/telemetry"
)

// A principal that may not read the approvals bucket resumes by naming the
// approval only; that request is observed like any other: the client counts
// it, and its span's trace reaches the worker (the resumed execution's audit
// events carry it).
func TestTracing_ResumeByApprovalIDIsObserved(t *testing.T) {
	t.Parallel()
	setup, err := auth.Init(t.TempDir(), "")
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range []auth.Grant{
		{Principal: "alice", Role: auth.RoleProducer, Actors: []string{"user:alice"}, Surfaces: []string{"direct"}, Capabilities: []string{"*"}},
		{Principal: "carol", Role: auth.RoleApprover, Actors: []string{"user:carol"}, Types: []string{"finance"}},
	} {
		if err := setup.Add(g); err != nil {
			t.Fatal(err)
		}
	}
	env := testenv.Start(t, testenv.Auth(setup))
	ctx := ctxT(t)
	admin, err := broker.Provision(ctx, env.Connect(t), broker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := auth.PublishGrants(ctx, admin.JS, setup, 0); err != nil {
		t.Fatal(err)
	}
	finance := executor.Policy{Name: "finance", Evaluate: func(context.Context, executor.PolicyRequest) (executor.Decision, error) {
		return executor.Decision{Stance: executor.StanceRequireApproval, Reason: "refunds need finance", ApprovalTypes: []string{"finance"}}, nil
	}}
	refund := executor.Define("t.refund", executor.Meta{Description: "Refunds.", Expose: executor.On(executor.SurfaceDirect),
		SideEffect: executor.SideEffectWrite, Policies: []executor.Policy{finance}},
		func(ctx context.Context, c executor.Call[echoIn]) (echoIn, error) { return c.Input, nil })
	stop := runWorker(t, env.ConnectAs(t, auth.WorkerPrincipal), executor.WorkerConfig{Pool: "obs"}, refund)

	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	tel := telemetry.New(telemetry.Options{TracerProvider: tp})
	alice := newClientOn(t, env.ConnectAs(t, "alice"), executor.ClientConfig{Observer: tel.Client()})
	asked, err := alice.Call(ctx, "t.refund", echoIn{Hello: "refund"})
	if err != nil || asked.Status != envelope.StatusApprovalRequired {
		t.Fatalf("call: %v %+v", err, asked)
	}
	if _, err := approvalsrpc.Decide(ctx, env.ConnectAs(t, "carol"), broker.NewNames(setup.Prefix),
		approvalsrpc.DecideRequest{ApprovalID: asked.Approval.ID, Approve: true}); err != nil {
		t.Fatal(err)
	}
	done, err := alice.Resume(ctx, asked.Approval.ID)
	if err != nil || done.Status != envelope.StatusCompleted {
		t.Fatalf("resume: %v %+v", err, done)
	}
	stop()

	if got := sum(scrape(t, tel.Handler()), "capstan_client_requests_total"); got != 2 {
		t.Errorf("%v requests counted, want 2: the call and its resume", got)
	}
	calls := map[string]bool{}
	for _, s := range spans.GetSpans() {
		calls[s.SpanContext.TraceID().String()] = true
	}
	trail, err := audit.Read(ctx, admin.NC, admin.Names.Prefix(), "alice", done.ExecutionID)
	if err != nil {
		t.Fatal(err)
	}
	if len(trail) == 0 {
		t.Fatal("no audit trail")
	}
	for _, ev := range trail {
		if !calls[ev.TraceID] {
			t.Errorf("%s carries trace id %q, which no span of the client's has", ev.Type, ev.TraceID)
		}
	}
}

// newClientOn is newClient for a connection of a principal, acting as it.
func newClientOn(t *testing.T, nc *nats.Conn, cfg executor.ClientConfig) *executor.Client {
	t.Helper()
	cfg.Actor = envelope.Actor{Kind: envelope.ActorUser, ID: "alice"}
	c, err := executor.NewClient(nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}
