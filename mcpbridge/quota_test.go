package mcpbridge_test

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capstan-dev/capstan/auth"
	"github.com/capstan-dev/capstan/capstantest"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/capstan-dev/capstan/mcpbridge"
)

// A model whose gateway is over its queue quota (DESIGN §12 "Quotas") is
// told so by the tool's result: QUOTA_EXCEEDED, retryable, with the quota,
// its limit and when to try again; nothing was queued.
func TestSecured_OverItsQueueQuotaTheModelSeesQuotaExceeded(t *testing.T) {
	t.Parallel()
	setup, err := auth.Init(t.TempDir(), "")
	if err != nil {
		t.Fatal(err)
	}
	quotas := auth.DefaultQuotas
	quotas.QueuedRequests = 1
	if err := setup.Add(auth.Grant{Principal: "gateway", Role: auth.RoleProducer, Actors: []string{"user:*"}, Surfaces: []string{"mcp"},
		Capabilities: []string{"*"}, Quotas: &quotas}); err != nil {
		t.Fatal(err)
	}
	env := testenv.Start(t, testenv.Auth(setup))
	ctx := testCtx(t)
	admin, err := broker.Provision(ctx, env.Connect(t), broker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := auth.PublishGrants(ctx, admin.JS, setup, 0); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	reg, err := executor.NewRegistry(executor.Define("test.hold", executor.Meta{
		Description: "Holds its slot until the test ends.", Expose: executor.On(executor.SurfaceMCP), SideEffect: executor.SideEffectNone,
	}, func(ctx context.Context, c executor.Call[blockIn]) (string, error) {
		select {
		case <-release:
		case <-ctx.Done():
		}
		return "held", nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	capstantest.Worker(t, reg, capstantest.WithConn(env.ConnectAs(t, auth.WorkerPrincipal)))
	t.Cleanup(func() { close(release) }) // before the worker stops: cleanups run last first

	gw := env.ConnectAs(t, "gateway")
	// One held call fills the gateway's queue.
	c, err := executor.NewClient(gw, executor.ClientConfig{Surface: executor.SurfaceMCP, Actor: alice})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if _, err := c.Submit(ctx, "test.hold", blockIn{Note: "fills the queue"}); err != nil {
		t.Fatal(err)
	}

	bridge, err := mcpbridge.New(gw, mcpbridge.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bridge.Close() })
	tokens, err := mcpbridge.NewTokens(map[string]envelope.Actor{aliceToken: alice})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(bridge.Handler(tokens, nil))
	t.Cleanup(hs.Close)
	cs := connectHTTP(t, hs.URL, aliceToken, newEvents())
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "test.hold", Arguments: map[string]any{"note": "one too many"}})
	if err != nil {
		t.Fatal(err)
	}
	text := textOf(res)
	if !res.IsError || !strings.HasPrefix(text, "QUOTA_EXCEEDED: ") || !strings.Contains(text, "(retryable)") ||
		!strings.Contains(text, `{"limit":1,"quota":"queuedRequests","retryAfterMs":1000}`) {
		t.Fatalf("what the model sees: error %v\n%s", res.IsError, text)
	}
	me, ok := res.StructuredContent.(map[string]any)
	if !ok || me["code"] != "QUOTA_EXCEEDED" {
		t.Fatalf("structured content: %#v", res.StructuredContent)
	}
}
