package mcpbridge_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/auth"
	"github.com/capstan-dev/capstan/capstantest"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/approvalsrpc"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/capstan-dev/capstan/mcpbridge"
)

const malloryToken = "mallory-token-0123456789"

// mallory is authenticated by the bridge, but the bridge's grant does not let
// it assert her actor (user:* only).
var mallory = envelope.Actor{Kind: envelope.ActorAgent, ID: "mallory"}

type payIn struct {
	Amount int `json:"amount"`
}

// TestSecured_BridgeIsADelegatingProducer runs the bridge as a producer
// principal whose grant lets it assert user:* on the mcp surface, against a
// server with authentication: bearer tokens choose the actors, an actor the
// grant does not allow runs nothing, an approval decided by an approver
// principal runs the call once, and a request without a token is refused.
func TestSecured_BridgeIsADelegatingProducer(t *testing.T) {
	t.Parallel()
	setup, err := auth.Init(t.TempDir(), "")
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range []auth.Grant{
		{Principal: "gateway", Role: auth.RoleProducer, Actors: []string{"user:*"}, Surfaces: []string{"mcp"}, Capabilities: []string{"*"}},
		{Principal: "carol", Role: auth.RoleApprover, Actors: []string{"user:carol"}, Types: []string{"finance"}},
	} {
		if err := setup.Add(g); err != nil {
			t.Fatal(err)
		}
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

	var echoes, pays atomic.Int32
	reg, err := executor.NewRegistry(
		executor.Define("test.echo", executor.Meta{
			Description: "Echoes its note.", Expose: executor.On(executor.SurfaceMCP), SideEffect: executor.SideEffectNone,
		}, func(ctx context.Context, c executor.Call[blockIn]) (string, error) {
			echoes.Add(1)
			return "echo " + c.Input.Note + " for " + c.Actor.String(), nil
		}),
		executor.Define("test.pay", executor.Meta{
			Description: "Pays; always needs a finance approval.", Expose: executor.On(executor.SurfaceMCP),
			SideEffect: executor.SideEffectWrite,
			Policies: []executor.Policy{{Name: "finance-approves",
				Evaluate: func(ctx context.Context, r executor.PolicyRequest) (executor.Decision, error) {
					return executor.Decision{Stance: executor.StanceRequireApproval, ApprovalTypes: []string{"finance"},
						Reason: "every payment needs a finance approval"}, nil
				}}},
		}, func(ctx context.Context, c executor.Call[payIn]) (int, error) {
			pays.Add(1)
			return c.Input.Amount, nil
		}),
	)
	if err != nil {
		t.Fatal(err)
	}
	capstantest.Worker(t, reg, capstantest.WithConn(env.ConnectAs(t, auth.WorkerPrincipal)))

	gw := env.ConnectAs(t, "gateway")
	// The worker serves once describe, asked as the gateway, lists both.
	probe, err := executor.NewClient(gw, executor.ClientConfig{Surface: executor.SurfaceMCP})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = probe.Close() })
	for {
		d, err := probe.Describe(ctx, executor.SurfaceMCP, alice, executor.Scope{})
		if err == nil && listsAll(d, []string{"test.echo", "test.pay"}) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the worker never answered describe: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
	}

	bridge, err := mcpbridge.New(gw, mcpbridge.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bridge.Close() })
	tokens, err := mcpbridge.NewTokens(map[string]envelope.Actor{aliceToken: alice, bobToken: bob, malloryToken: mallory})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(bridge.Handler(tokens, nil))
	t.Cleanup(hs.Close)
	srv := hs.URL

	aliceCS := connectHTTP(t, srv, aliceToken, newEvents())
	bobCS := connectHTTP(t, srv, bobToken, newEvents())

	// tools/list and a call, as alice.
	if names := toolNames(t, aliceCS); !containsAll(names, "test_echo", "test_pay", mcpbridge.ResumeTool, mcpbridge.StatusTool) {
		t.Fatalf("alice's tools: %v", names)
	}
	res, err := aliceCS.CallTool(ctx, &mcp.CallToolParams{Name: "test.echo", Arguments: map[string]any{"note": "hi"}})
	if err != nil {
		t.Fatal(err)
	}
	if res.IsError || !strings.Contains(textOf(res), "echo hi for user:alice") {
		t.Fatalf("alice's call: %s", textOf(res))
	}
	// capstan.status reads the execution from the gateway's own record and
	// envelope; bob, with the same id, reads nothing.
	execID, _ := res.Meta["capstan/executionId"].(string)
	if execID == "" {
		t.Fatalf("no execution id in %v", res.Meta)
	}
	st, err := aliceCS.CallTool(ctx, &mcp.CallToolParams{Name: mcpbridge.StatusTool, Arguments: map[string]any{"executionId": execID}})
	if err != nil || st.IsError || !strings.Contains(textOf(st), "echo hi") {
		t.Fatalf("alice's status: %v %s", err, textOf(st))
	}
	st, err = bobCS.CallTool(ctx, &mcp.CallToolParams{Name: mcpbridge.StatusTool, Arguments: map[string]any{"executionId": execID}})
	if err != nil || !st.IsError || strings.Contains(textOf(st), "echo hi") {
		t.Fatalf("bob read alice's execution: %v %s", err, textOf(st))
	}

	// An actor the gateway's grant does not allow: no tools, nothing runs.
	malloryRefused(t, srv)
	if n := echoes.Load(); n != 1 {
		t.Fatalf("test.echo ran %d times, want 1", n)
	}

	// An approval-required call, approved by carol's principal.
	pay := &mcp.CallToolParams{Name: "test.pay", Arguments: map[string]any{"amount": 42}}
	res, err = aliceCS.CallTool(ctx, pay)
	if err != nil {
		t.Fatal(err)
	}
	ar := structured(t, res)
	approvalID, _ := ar["approvalId"].(string)
	if res.IsError || ar["status"] != "approval-required" || approvalID == "" {
		t.Fatalf("test.pay: %v %s", ar, textOf(res))
	}
	// Pending: the same call, and capstan.resume, answer the same approval.
	again, err := aliceCS.CallTool(ctx, pay)
	if err != nil || structured(t, again)["approvalId"] != approvalID {
		t.Fatalf("the same call while pending: %v %s", err, textOf(again))
	}
	// Bob cannot resume alice's approval.
	stolen, err := bobCS.CallTool(ctx, &mcp.CallToolParams{Name: mcpbridge.ResumeTool, Arguments: map[string]any{"approvalId": approvalID}})
	if err != nil || !stolen.IsError {
		t.Fatalf("bob resumed alice's approval: %v %s", err, textOf(stolen))
	}
	rec, err := approvalsrpc.Decide(ctx, env.ConnectAs(t, "carol"), admin.Names,
		approvalsrpc.DecideRequest{ApprovalID: approvalID, Approve: true})
	if err != nil || rec.Status != approvals.StatusApproved || rec.Decision.Approver.String() != "user:carol" {
		t.Fatalf("carol's decision: %+v, %v", rec, err)
	}
	done, err := aliceCS.CallTool(ctx, pay)
	if err != nil || done.IsError || textOf(done) != "42" {
		t.Fatalf("the same call after approval: %v %s", err, textOf(done))
	}
	twice, err := aliceCS.CallTool(ctx, &mcp.CallToolParams{Name: mcpbridge.ResumeTool, Arguments: map[string]any{"approvalId": approvalID}})
	if err != nil || !twice.IsError || structured(t, twice)["code"] != string(envelope.CodeApprovalConsumed) {
		t.Fatalf("a second resume: %v %s, want APPROVAL_CONSUMED", err, textOf(twice))
	}
	if n := pays.Load(); n != 1 {
		t.Fatalf("test.pay ran %d times, want exactly 1", n)
	}

	// After a restart the bridge knows whose execution an id is without
	// reading the audit trail (a producer may not): from the id itself.
	restarted, err := mcpbridge.New(env.ConnectAs(t, "gateway"), mcpbridge.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = restarted.Close() })
	for _, who := range []struct {
		actor envelope.Actor
		reads bool
	}{{alice, true}, {bob, false}} {
		srv, err := restarted.Server(ctx, who.actor)
		if err != nil {
			t.Fatal(err)
		}
		ct, stp := mcp.NewInMemoryTransports()
		ss, err := srv.Connect(ctx, stp, nil)
		if err != nil {
			t.Fatal(err)
		}
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "v0"}, nil).Connect(ctx, ct, nil)
		if err != nil {
			t.Fatal(err)
		}
		st, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: mcpbridge.StatusTool, Arguments: map[string]any{"executionId": execID}})
		if err != nil || st.IsError == who.reads || strings.Contains(textOf(st), "echo hi") != who.reads {
			t.Fatalf("%s's status after a restart: %v %s", who.actor, err, textOf(st))
		}
		_ = cs.Close()
		_ = ss.Close()
	}

	// No token, no tools.
	if code := postToolsList(t, srv, ""); code != http.StatusUnauthorized {
		t.Fatalf("tools/list without a token: status %d, want 401", code)
	}
}

// malloryRefused checks that a token whose actor the bridge may not assert
// gets no tool: 403 FORBIDDEN on any request, and no session.
func malloryRefused(t *testing.T, url string) {
	t.Helper()
	if code := postToolsList(t, url, malloryToken); code != http.StatusForbidden {
		t.Fatalf("mallory's tools/list: status %d, want 403", code)
	}
	tr := &mcp.StreamableClientTransport{Endpoint: url, MaxRetries: -1,
		HTTPClient: &http.Client{Transport: bearer{token: malloryToken, next: http.DefaultTransport}}}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "v0"}, nil).Connect(testCtx(t), tr, nil)
	if err == nil {
		_ = cs.Close()
		t.Fatal("mallory's SDK client connected")
	}
	if !strings.Contains(err.Error(), "Forbidden") {
		t.Fatalf("mallory's connect: %v, want Forbidden", err)
	}
}

func postToolsList(t *testing.T, url, token string) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	return resp.StatusCode
}

func containsAll(have []string, want ...string) bool {
	for _, w := range want {
		if !strings.Contains(","+strings.Join(have, ",")+",", ","+w+",") {
			return false
		}
	}
	return true
}
