package mcpbridge_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/internal/pauses"
	"github.com/capstan-dev/capstan/internal/testhooks"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/capstantest"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/demo"
	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/capstan-dev/capstan/mcpbridge"
)

var (
	alice = envelope.Actor{Kind: envelope.ActorUser, ID: "alice"}
	bob   = envelope.Actor{Kind: envelope.ActorUser, ID: "bob"}
)

const (
	aliceToken = "alice-token-0123456789"
	bobToken   = "bob-token-0123456789abc"
)

// blockIn is the input of test.block, which runs until it is cancelled.
type blockIn struct {
	Note string `json:"note"`
}

// fixture is a real embedded JetStream, a worker serving the demo catalog and
// test capabilities, and a bridge.
type fixture struct {
	env     *testenv.Env
	nc      *nats.Conn
	bridge  *mcpbridge.Bridge
	started chan string   // execution ids of test.block and test.gate as they start
	gate    chan struct{} // test.gate returns when it receives
	client  *executor.Client
}

func (f *fixture) bridgeCatalog(t *testing.T) jetstream.KeyValue {
	return testhooks.Broker(f.client).Catalog
}

func (f *fixture) bridgeBroker(t *testing.T) *broker.Broker { return testhooks.Broker(f.client) }

func start(t *testing.T, cfg mcpbridge.Config) *fixture {
	t.Helper()
	f := &fixture{env: testenv.Start(t), started: make(chan string, 16), gate: make(chan struct{})}
	f.nc = f.env.Connect(t)
	ctx := testCtx(t)
	js, err := demo.Provision(ctx, f.nc, 0)
	if err != nil {
		t.Fatal(err)
	}
	caps := append(demo.Catalog(js),
		executor.Define("test.block", executor.Meta{
			Description: "Runs until cancelled.", Expose: executor.On(executor.SurfaceMCP),
			SideEffect: executor.SideEffectRead, Timeout: time.Minute,
		}, func(ctx context.Context, c executor.Call[blockIn]) (string, error) {
			f.started <- c.ExecutionID
			<-ctx.Done()
			return "", ctx.Err()
		}),
		executor.Define("test.gate", executor.Meta{
			Description: "Returns when the test opens the gate.", Expose: executor.On(executor.SurfaceMCP),
			SideEffect: executor.SideEffectRead, Timeout: time.Minute,
		}, func(ctx context.Context, c executor.Call[blockIn]) (string, error) {
			f.started <- c.ExecutionID
			select {
			case <-f.gate:
				return "through " + c.Input.Note, nil
			case <-ctx.Done():
				return "", ctx.Err()
			}
		}),
		executor.Define("test.progress", executor.Meta{
			Description: "Reports a third of its work done, then returns when the test opens the gate.",
			Expose:      executor.On(executor.SurfaceMCP), SideEffect: executor.SideEffectRead, Timeout: time.Minute,
		}, func(ctx context.Context, c executor.Call[blockIn]) (string, error) {
			c.Progress(1, 3, "first third")
			select {
			case <-f.gate:
				return "all thirds", nil
			case <-ctx.Done():
				return "", ctx.Err()
			}
		}),
		executor.Define("test.direct", executor.Meta{
			Description: "Not exposed on mcp.", Expose: executor.On(executor.SurfaceDirect), SideEffect: executor.SideEffectNone,
		}, func(ctx context.Context, c executor.Call[blockIn]) (string, error) { return "no", nil }),
		executor.Define("test.secret", executor.Meta{
			Description: "Fails with a private cause.", Expose: executor.On(executor.SurfaceMCP), SideEffect: executor.SideEffectNone,
		}, func(ctx context.Context, c executor.Call[blockIn]) (string, error) {
			return "", errors.New("connect to db as admin:hunter2 failed")
		}),
		executor.Define("test.alice-only", executor.Meta{
			Description: "Hidden from bob by a policy.", Expose: executor.On(executor.SurfaceMCP), SideEffect: executor.SideEffectNone,
			Policies: []executor.Policy{{Name: "not-bob", Phases: []executor.Phase{executor.PhaseDiscovery, executor.PhaseInvocation},
				Evaluate: func(ctx context.Context, r executor.PolicyRequest) (executor.Decision, error) {
					if r.Actor.ID == bob.ID {
						return executor.Decision{Stance: executor.StanceHide, Reason: "not for bob"}, nil
					}
					return executor.Decision{Stance: executor.StanceAllow}, nil
				}}},
		}, func(ctx context.Context, c executor.Call[blockIn]) (string, error) { return "for alice", nil }),
		executor.Define("test.wipe", executor.Meta{
			Description: "Destructive.", Expose: executor.On(executor.SurfaceMCP), SideEffect: executor.SideEffectDestructive,
		}, func(ctx context.Context, c executor.Call[blockIn]) (string, error) { return "wiped", nil }),
	)
	f.runWorker(t, "default", caps...)
	f.client, err = executor.NewClient(f.nc, executor.ClientConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.client.Close() })
	f.bridge, err = mcpbridge.New(f.nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.bridge.Close() })
	return f
}

// runWorker serves caps in pool until the test ends.
func (f *fixture) runWorker(t *testing.T, pool string, caps ...executor.Capability) context.CancelFunc {
	t.Helper()
	reg, err := executor.NewRegistry(caps...)
	if err != nil {
		t.Fatal(err)
	}
	nc := f.env.Connect(t)
	w := capstantest.Worker(t, reg, capstantest.WithConn(nc), capstantest.WithConfig(executor.WorkerConfig{Pool: pool}))
	c, err := executor.NewClient(nc, executor.ClientConfig{Surface: executor.SurfaceDirect})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx2 := testCtx(t)
	// Serving once describe lists every capability of caps exposed on mcp
	// (and not hidden from alice).
	var want []string
	for _, c := range caps {
		if executor.Exposure(c.Meta().Expose).Has(executor.SurfaceMCP) && len(c.Meta().Policies) == 0 {
			want = append(want, c.ID())
		}
	}
	for {
		d, err := c.Describe(ctx2, executor.SurfaceMCP, alice, executor.Scope{})
		if err == nil && listsAll(d, want) {
			return w.Stop
		}
		if !errors.Is(err, executor.ErrNoWorkers) && err != nil {
			t.Fatal(err)
		}
		select {
		case <-ctx2.Done():
			t.Fatal("the worker never answered describe")
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func listsAll(d *executor.Discovery, ids []string) bool {
	for _, id := range ids {
		if !slices.ContainsFunc(d.Capabilities, func(c executor.Descriptor) bool { return c.ID == id }) {
			return false
		}
	}
	return true
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// events collects what a client was told.
type events struct {
	mu       sync.Mutex
	progress []string
	values   []float64
	totals   []float64
	changed  chan struct{}
	progCh   chan string
}

func newEvents() *events {
	return &events{changed: make(chan struct{}, 16), progCh: make(chan string, 64)}
}

func (e *events) options() *mcp.ClientOptions {
	return &mcp.ClientOptions{
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) {
			select {
			case e.changed <- struct{}{}:
			default:
			}
		},
		ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
			e.mu.Lock()
			e.progress = append(e.progress, r.Params.Message)
			e.values = append(e.values, r.Params.Progress)
			e.totals = append(e.totals, r.Params.Total)
			e.mu.Unlock()
			select {
			case e.progCh <- r.Params.Message:
			default:
			}
		},
	}
}

// waitProgress waits until a progress message containing want arrived (the
// SDK client may hand notifications to their handler after the result).
func waitProgress(t *testing.T, ev *events, want string) {
	t.Helper()
	ctx := testCtx(t)
	for !strings.Contains(strings.Join(ev.messages(), "\n"), want) {
		select {
		case <-ev.progCh:
		case <-ctx.Done():
			t.Fatalf("no progress %q; got %v", want, ev.messages())
		}
	}
}

func (e *events) messages() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.progress)
}

// connectMemory connects an SDK client to actor's server in memory, as
// stdio does.
func (f *fixture) connectMemory(t *testing.T, actor envelope.Actor, ev *events) *mcp.ClientSession {
	t.Helper()
	ctx := testCtx(t)
	srv, err := f.bridge.Server(ctx, actor)
	if err != nil {
		t.Fatal(err)
	}
	ct, st := mcp.NewInMemoryTransports()
	ss, err := srv.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ss.Close() })
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "v0"}, ev.options()).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

// bearer adds a bearer token to every request.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// serveHTTP serves the bridge over streamable HTTP on 127.0.0.1 with alice's
// and bob's tokens.
func (f *fixture) serveHTTP(t *testing.T) *httptest.Server {
	t.Helper()
	return f.serveHTTPWith(t, nil)
}

func (f *fixture) serveHTTPWith(t *testing.T, opts *mcpbridge.HTTPOptions) *httptest.Server {
	t.Helper()
	tokens, err := mcpbridge.NewTokens(map[string]envelope.Actor{aliceToken: alice, bobToken: bob})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(f.bridge.Handler(tokens, opts))
	t.Cleanup(srv.Close)
	return srv
}

func connectHTTP(t *testing.T, url, token string, ev *events) *mcp.ClientSession {
	t.Helper()
	tr := &mcp.StreamableClientTransport{Endpoint: url,
		HTTPClient: &http.Client{Transport: bearer{token: token, next: http.DefaultTransport}}}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "v0"}, ev.options()).Connect(testCtx(t), tr, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

func toolNames(t *testing.T, cs *mcp.ClientSession) []string {
	t.Helper()
	res, err := cs.ListTools(testCtx(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range res.Tools {
		names = append(names, tl.Name)
	}
	return names
}

func textOf(r *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range r.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

func structured(t *testing.T, r *mcp.CallToolResult) map[string]any {
	t.Helper()
	j, err := json.Marshal(r.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(j, &m); err != nil {
		t.Fatalf("structured content %s is not an object: %v", j, err)
	}
	return m
}

// transports runs a test over both transports.
func transports(t *testing.T, f *fixture, run func(t *testing.T, connect func(envelope.Actor, *events) *mcp.ClientSession)) {
	t.Run("memory", func(t *testing.T) {
		run(t, func(a envelope.Actor, ev *events) *mcp.ClientSession { return f.connectMemory(t, a, ev) })
	})
	t.Run("http", func(t *testing.T) {
		srv := f.serveHTTP(t)
		run(t, func(a envelope.Actor, ev *events) *mcp.ClientSession {
			tok := map[string]string{alice.String(): aliceToken, bob.String(): bobToken}[a.String()]
			return connectHTTP(t, srv.URL, tok, ev)
		})
	})
}

func TestToolsList_IsDescribeOnTheMCPSurface(t *testing.T) {
	t.Parallel()
	f := start(t, mcpbridge.Config{})
	transports(t, f, func(t *testing.T, connect func(envelope.Actor, *events) *mcp.ClientSession) {
		cs := connect(alice, newEvents())
		res, err := cs.ListTools(testCtx(t), nil)
		if err != nil {
			t.Fatal(err)
		}
		if res.CacheScope != "" && res.CacheScope != "private" {
			t.Errorf("an actor's tool list has cache scope %q", res.CacheScope)
		}
		byName := map[string]*mcp.Tool{}
		for _, tl := range res.Tools {
			byName[tl.Name] = tl
		}
		for _, want := range []string{"demo_echo", "orders_refund", "email_send", "test_block", "test_wipe",
			mcpbridge.ResumeTool, mcpbridge.StatusTool} {
			if byName[want] == nil {
				t.Errorf("tools/list lacks %s", want)
			}
		}
		if byName["test_direct"] != nil {
			t.Error("a capability not exposed on mcp is listed")
		}
		if byName["test_alice-only"] == nil {
			t.Error("alice does not see test.alice-only")
		}
		// A policy hides it from bob: absent from his list, and not callable.
		bobCS := connect(bob, newEvents())
		if slices.Contains(toolNames(t, bobCS), "test_alice-only") {
			t.Error("a capability hidden from bob is listed for him")
		}
		if res, err := bobCS.CallTool(testCtx(t), &mcp.CallToolParams{Name: "test.alice-only", Arguments: map[string]any{}}); err == nil && !res.IsError {
			t.Errorf("bob called a capability hidden from him: %s", textOf(res))
		}
		refund := byName["orders_refund"]
		if refund == nil {
			t.FailNow()
		}
		schema, _ := json.Marshal(refund.InputSchema)
		if !strings.Contains(string(schema), `"orderId"`) || !strings.Contains(string(schema), `"object"`) {
			t.Errorf("orders.refund input schema = %s", schema)
		}
		if a := refund.Annotations; a == nil || a.ReadOnlyHint || a.DestructiveHint == nil || *a.DestructiveHint || !a.IdempotentHint {
			t.Errorf("orders.refund annotations = %+v", refund.Annotations)
		}
		if a := byName["demo_echo"].Annotations; a == nil || !a.ReadOnlyHint {
			t.Errorf("demo.echo annotations = %+v", a)
		}
		if a := byName["test_wipe"].Annotations; a == nil || a.DestructiveHint == nil || !*a.DestructiveHint {
			t.Errorf("test.wipe annotations = %+v", a)
		}
		if a := byName["email_send"].Annotations; a == nil || a.OpenWorldHint == nil || !*a.OpenWorldHint || a.ReadOnlyHint {
			t.Errorf("email.send annotations = %+v", a)
		}
	})
}

func TestToolsCall_CompletedIsStructuredContentAndText(t *testing.T) {
	t.Parallel()
	f := start(t, mcpbridge.Config{})
	transports(t, f, func(t *testing.T, connect func(envelope.Actor, *events) *mcp.ClientSession) {
		cs := connect(alice, newEvents())
		res, err := cs.CallTool(testCtx(t), &mcp.CallToolParams{Name: "demo.echo", Arguments: map[string]any{"hello": "world"}})
		if err != nil {
			t.Fatal(err)
		}
		if res.IsError {
			t.Fatalf("isError: %s", textOf(res))
		}
		if got := structured(t, res)["hello"]; got != "world" {
			t.Errorf("structured content = %v", res.StructuredContent)
		}
		if textOf(res) != `{"hello":"world"}` {
			t.Errorf("text = %s", textOf(res))
		}
		id, _ := res.Meta["capstan/executionId"].(string)
		if envelope.ValidExecutionID(id) != nil {
			t.Errorf("no execution id in _meta: %v", res.Meta)
		}
	})
}

func TestToolsCall_InputErrorsCarryTheirPaths(t *testing.T) {
	t.Parallel()
	f := start(t, mcpbridge.Config{})
	transports(t, f, func(t *testing.T, connect func(envelope.Actor, *events) *mcp.ClientSession) {
		cs := connect(alice, newEvents())
		res, err := cs.CallTool(testCtx(t), &mcp.CallToolParams{Name: "orders.refund",
			Arguments: map[string]any{"orderId": 7, "amount": "many"}})
		if err != nil {
			t.Fatal(err)
		}
		if !res.IsError {
			t.Fatalf("a bad input did not end isError: %s", textOf(res))
		}
		me := structured(t, res)
		if me["code"] != string(envelope.CodeInputInvalid) {
			t.Errorf("code = %v", me["code"])
		}
		details, _ := json.Marshal(me["details"])
		for _, path := range []string{"orderId", "amount"} {
			if !strings.Contains(string(details), path) || !strings.Contains(textOf(res), path) {
				t.Errorf("the error does not name %s: details %s, text %s", path, details, textOf(res))
			}
		}
	})
}

func TestToolsCall_FailureShowsOnlyForModel(t *testing.T) {
	t.Parallel()
	f := start(t, mcpbridge.Config{})
	transports(t, f, func(t *testing.T, connect func(envelope.Actor, *events) *mcp.ClientSession) {
		cs := connect(alice, newEvents())
		// Three failures where three attempts are allowed: the last one is the
		// envelope's error, exposed with its message.
		res, err := cs.CallTool(testCtx(t), &mcp.CallToolParams{Name: "demo.flaky", Arguments: map[string]any{"failTimes": 3}})
		if err != nil {
			t.Fatal(err)
		}
		if !res.IsError {
			t.Fatalf("not isError: %s", textOf(res))
		}
		want := envelope.ModelError{Code: envelope.CodeExecutionFailed, Message: "Attempt 3 failed on purpose.", Retryable: true}
		j, _ := json.Marshal(want)
		var wantMap map[string]any
		_ = json.Unmarshal(j, &wantMap)
		got := structured(t, res)
		if len(got) != len(wantMap) || got["code"] != wantMap["code"] || got["message"] != wantMap["message"] {
			t.Errorf("structured content = %v, want exactly ForModel() %v", got, wantMap)
		}

		// A handler's undeclared error: its cause never reaches the model.
		res, err = cs.CallTool(testCtx(t), &mcp.CallToolParams{Name: "test.secret", Arguments: map[string]any{"note": "n"}})
		if err != nil {
			t.Fatal(err)
		}
		j, _ = json.Marshal(res)
		if !res.IsError || strings.Contains(string(j), "hunter2") || structured(t, res)["code"] != string(envelope.CodeInternalError) {
			t.Errorf("undeclared failure = %s", j)
		}
	})
}

func TestProgress_StatesFromTheAuditTrail(t *testing.T) {
	t.Parallel()
	f := start(t, mcpbridge.Config{})
	transports(t, f, func(t *testing.T, connect func(envelope.Actor, *events) *mcp.ClientSession) {
		ev := newEvents()
		cs := connect(alice, ev)
		res, err := cs.CallTool(testCtx(t), &mcp.CallToolParams{Name: "demo.flaky", Arguments: map[string]any{"failTimes": 1},
			Meta: mcp.Meta{"progressToken": "p1"}})
		if err != nil {
			t.Fatal(err)
		}
		if res.IsError {
			t.Fatalf("isError: %s", textOf(res))
		}
		for _, want := range []string{"queued", "started, attempt 1", "retrying: attempt 2", "started, attempt 2", "completed"} {
			waitProgress(t, ev, want)
		}
	})
}

// callBlockedThenCancel calls test.block on cs and cancels the call once its
// handler has started (the SDK client sends notifications/cancelled); it
// returns the execution id and what CallTool returned.
func (f *fixture) callBlockedThenCancel(t *testing.T, cs *mcp.ClientSession, note string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "test.block", Arguments: map[string]any{"note": note}})
		errc <- err
	}()
	var id string
	select {
	case id = <-f.started:
	case <-testCtx(t).Done():
		t.Fatal("test.block never started")
	}
	cancel()
	return id, <-errc
}

func TestCancelled_NotificationCancelsTheExecution(t *testing.T) {
	t.Parallel()
	f := start(t, mcpbridge.Config{})
	c := f.client
	transports(t, f, func(t *testing.T, connect func(envelope.Actor, *events) *mcp.ClientSession) {
		cs := connect(alice, newEvents())
		id, err := f.callBlockedThenCancel(t, cs, "x")
		if !errors.Is(err, context.Canceled) {
			t.Errorf("CallTool = %v, want context.Canceled", err)
		}
		actx, acancel := context.WithTimeout(testCtx(t), 15*time.Second)
		env, err := c.Await(actx, id)
		acancel()
		if err != nil {
			st, serr := c.Status(testCtx(t), id)
			j, _ := json.Marshal(st)
			tr, _ := audit.Read(testCtx(t), testhooks.Broker(c).NC, testhooks.Broker(c).Names.Prefix(), broker.Anonymous, id)
			t.Fatalf("%v: status %s %v; trail %+v", err, j, serr, tr)
		}
		if env.Status != envelope.StatusCancelled || env.Error == nil || env.Error.Code != envelope.CodeCancelled {
			t.Errorf("envelope = %s %+v, want cancelled CANCELLED", env.Status, env.Error)
		}
	})
}

func TestApproval_EndToEnd_AnotherActorApproves_RunsOnce(t *testing.T) {
	t.Parallel()
	f := start(t, mcpbridge.Config{})
	c := f.client
	transports(t, f, func(t *testing.T, connect func(envelope.Actor, *events) *mcp.ClientSession) {
		ctx := testCtx(t)
		ev := newEvents()
		cs := connect(alice, ev)
		orderID := "o-" + strings.ReplaceAll(t.Name(), "/", "-")
		call := &mcp.CallToolParams{Name: "orders.refund", Arguments: map[string]any{"orderId": orderID, "amount": 900},
			Meta: mcp.Meta{"progressToken": "a1"}}
		res, err := cs.CallTool(ctx, call)
		if err != nil {
			t.Fatal(err)
		}
		ar := structured(t, res)
		approvalID, _ := ar["approvalId"].(string)
		if res.IsError || ar["status"] != "approval-required" || approvalID == "" {
			t.Fatalf("first call = %v %s", ar, textOf(res))
		}
		if !strings.Contains(textOf(res), "finance") || !strings.Contains(textOf(res), approvalID) {
			t.Errorf("the model is not told what is pending and why: %s", textOf(res))
		}
		waitProgress(t, ev, "waiting for approval "+approvalID)

		// Still pending: the same call answers the same approval, runs nothing.
		again, err := cs.CallTool(ctx, call)
		if err != nil {
			t.Fatal(err)
		}
		if got := structured(t, again)["approvalId"]; got != approvalID {
			t.Errorf("the same call while pending asked for approval %v, want %s", got, approvalID)
		}

		// Bob, over MCP, cannot resume alice's approval.
		bobCS := connect(bob, newEvents())
		stolen, err := bobCS.CallTool(ctx, &mcp.CallToolParams{Name: mcpbridge.ResumeTool, Arguments: map[string]any{"approvalId": approvalID}})
		if err != nil {
			t.Fatal(err)
		}
		if !stolen.IsError {
			t.Errorf("bob resumed alice's approval: %s", textOf(stolen))
		}

		// Bob approves through the approvals store.
		if _, err := c.Decide(ctx, approvalID, approvals.Verdict{Approve: true, Approver: bob}); err != nil {
			t.Fatal(err)
		}
		done, err := cs.CallTool(ctx, call)
		if err != nil {
			t.Fatal(err)
		}
		if done.IsError || structured(t, done)["orderId"] != orderID {
			t.Fatalf("the same call after approval = %s", textOf(done))
		}
		// The approval authorized one execution: resuming it again is refused.
		twice, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: mcpbridge.ResumeTool, Arguments: map[string]any{"approvalId": approvalID}})
		if err != nil {
			t.Fatal(err)
		}
		if !twice.IsError || structured(t, twice)["code"] != string(envelope.CodeApprovalConsumed) {
			t.Errorf("a second resume = %s, want APPROVAL_CONSUMED", textOf(twice))
		}
	})
}

func TestApprovalWait_ResumesOnceApproved(t *testing.T) {
	t.Parallel()
	f := start(t, mcpbridge.Config{ApprovalWait: time.Minute})
	c := f.client
	ev := newEvents()
	cs := f.connectMemory(t, alice, ev)
	ctx := testCtx(t)
	resc := make(chan *mcp.CallToolResult, 1)
	go func() {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "orders.refund",
			Arguments: map[string]any{"orderId": "o-wait", "amount": 700}, Meta: mcp.Meta{"progressToken": "w"}})
		if err != nil {
			t.Error(err)
		}
		resc <- res
	}()
	var approvalID string
	for approvalID == "" {
		select {
		case msg := <-ev.progCh:
			if id, ok := strings.CutPrefix(msg, "waiting for approval "); ok {
				approvalID = id
			}
		case <-ctx.Done():
			t.Fatal("no 'waiting for approval' progress")
		}
	}
	if _, err := c.Decide(ctx, approvalID, approvals.Verdict{Approve: true, Approver: bob}); err != nil {
		t.Fatal(err)
	}
	res := <-resc
	if res == nil || res.IsError || structured(t, res)["orderId"] != "o-wait" {
		t.Fatalf("result after approval = %+v", res)
	}
	waitProgress(t, ev, "approved by user:bob")
	ev.mu.Lock()
	defer ev.mu.Unlock()
	for i := 1; i < len(ev.values); i++ {
		if ev.values[i] <= ev.values[i-1] {
			t.Errorf("progress did not grow: %v (%v)", ev.values, ev.progress)
		}
	}
}

func TestListChanged_WhenAWorkerStartsAndACapabilityGoes(t *testing.T) {
	t.Parallel()
	f := start(t, mcpbridge.Config{})
	ev := newEvents()
	mem := f.connectMemory(t, alice, ev)
	srv := f.serveHTTP(t)
	evHTTP := newEvents()
	web := connectHTTP(t, srv.URL, aliceToken, evHTTP)
	for _, cs := range []*mcp.ClientSession{mem, web} {
		if slices.Contains(toolNames(t, cs), "test.late") {
			t.Fatal("test.late listed before any worker serves it")
		}
	}
	f.runWorker(t, "late", executor.Define("test.late", executor.Meta{
		Description: "Served late.", Expose: executor.On(executor.SurfaceMCP), SideEffect: executor.SideEffectNone,
	}, func(ctx context.Context, c executor.Call[blockIn]) (string, error) { return "late", nil }))
	waitChanged(t, ev, mem, "test.late", true)
	waitChanged(t, evHTTP, web, "test.late", true)

	// A catalog entry that goes (as when no live worker serves it).
	kv := f.bridgeCatalog(t)
	if err := kv.Delete(testCtx(t), "test.late"); err != nil {
		t.Fatal(err)
	}
	waitChanged(t, ev, mem, "test.late", false)
	waitChanged(t, evHTTP, web, "test.late", false)
}

// waitChanged waits for list_changed notifications until the listing has
// (or lacks) name.
func waitChanged(t *testing.T, ev *events, cs *mcp.ClientSession, name string, want bool) {
	t.Helper()
	ctx := testCtx(t)
	for {
		select {
		case <-ev.changed:
			if slices.Contains(toolNames(t, cs), mcpbridge.ToolName(name, mcpbridge.ToolNamesPortable)) == want {
				return
			}
		case <-ctx.Done():
			t.Fatalf("no list_changed after which %s is listed=%v; listed: %v", name, want, toolNames(t, cs))
		}
	}
}

func TestHTTP_NoTokenNoTools(t *testing.T) {
	t.Parallel()
	f := start(t, mcpbridge.Config{})
	srv := f.serveHTTP(t)
	body := `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}`
	for name, header := range map[string]string{"none": "", "wrong": "Bearer not-a-token-of-anyone", "basic": "Basic YWxpY2U6eA=="} {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if header != "" {
			req.Header.Set("Authorization", header)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s: status %d, want 401", name, resp.StatusCode)
		}
	}
	tr := &mcp.StreamableClientTransport{Endpoint: srv.URL, MaxRetries: -1,
		HTTPClient: &http.Client{Transport: bearer{token: "wrong-token-0123456789", next: http.DefaultTransport}}}
	if cs, err := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "v0"}, nil).Connect(testCtx(t), tr, nil); err == nil {
		_ = cs.Close()
		t.Error("an SDK client with an unknown token connected")
	}
}

func TestHTTP_TokenChoosesTheActor(t *testing.T) {
	t.Parallel()
	f := start(t, mcpbridge.Config{})
	srv := f.serveHTTP(t)
	cs := connectHTTP(t, srv.URL, bobToken, newEvents())
	res, err := cs.CallTool(testCtx(t), &mcp.CallToolParams{Name: "demo.echo", Arguments: map[string]any{"x": 1}})
	if err != nil {
		t.Fatal(err)
	}
	id, _ := res.Meta["capstan/executionId"].(string)
	trail, err := audit.Read(testCtx(t), f.bridgeBroker(t).NC, f.bridgeBroker(t).Names.Prefix(), broker.Anonymous, id)
	if err != nil {
		t.Fatal(err)
	}
	if trail[0].Type != audit.EventRequested || trail[0].Actor.ID != "bob" || trail[0].Surface != string(executor.SurfaceMCP) {
		t.Errorf("first event = %+v, want requested by user:bob on mcp", trail[0])
	}
}

func TestSessions_SurviveANATSReconnect(t *testing.T) {
	t.Parallel()
	f := start(t, mcpbridge.Config{})
	mem := f.connectMemory(t, alice, newEvents())
	srv := f.serveHTTP(t)
	web := connectHTTP(t, srv.URL, aliceToken, newEvents())
	reconnected := make(chan struct{}, 1)
	f.nc.SetReconnectHandler(func(*nats.Conn) { reconnected <- struct{}{} })

	f.env.Restart(t)
	select {
	case <-reconnected:
	case <-testCtx(t).Done():
		t.Fatal("the bridge's connection never reconnected")
	}
	for name, cs := range map[string]*mcp.ClientSession{"memory": mem, "http": web} {
		// The worker may still be reconnecting: a call that finds no worker
		// yet is answered once one serves again (the request waits in its
		// stream).
		res, err := cs.CallTool(testCtx(t), &mcp.CallToolParams{Name: "demo.echo", Arguments: map[string]any{"after": "restart"}})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if res.IsError || structured(t, res)["after"] != "restart" {
			t.Errorf("%s: after a reconnect = %s", name, textOf(res))
		}
	}
}

func TestNoWorkerYet_ToolsArriveWithListChanged(t *testing.T) {
	t.Parallel()
	f := &fixture{env: testenv.Start(t), started: make(chan string, 1)}
	f.nc = f.env.Connect(t)
	// The server provisions capstan's resources (clients never do); no
	// worker has started yet.
	if _, err := broker.Provision(testCtx(t), f.nc, broker.Config{}); err != nil {
		t.Fatal(err)
	}
	b, err := mcpbridge.New(f.nc, mcpbridge.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	f.bridge = b
	ev := newEvents()
	cs := f.connectMemory(t, alice, ev)
	if names := toolNames(t, cs); len(names) != 2 {
		t.Fatalf("with no worker, tools = %v, want only the bridge's two", names)
	}
	f.runWorker(t, "default", executor.Define("test.first", executor.Meta{
		Description: "First served.", Expose: executor.On(executor.SurfaceMCP), SideEffect: executor.SideEffectNone,
	}, func(ctx context.Context, c executor.Call[blockIn]) (string, error) { return "first", nil }))
	waitChanged(t, ev, cs, "test.first", true)
}

func TestHTTPStateless_Protocol20260728(t *testing.T) {
	t.Parallel()
	f := start(t, mcpbridge.Config{})
	srv := f.serveHTTPWith(t, &mcpbridge.HTTPOptions{Stateless: true})
	ev := newEvents()
	cs := connectHTTP(t, srv.URL, aliceToken, ev)
	if v := cs.InitializeResult().ProtocolVersion; v < "2026-07-28" {
		t.Errorf("negotiated %s", v)
	}
	res, err := cs.CallTool(testCtx(t), &mcp.CallToolParams{Name: "demo.flaky", Arguments: map[string]any{"failTimes": 1},
		Meta: mcp.Meta{"progressToken": "s"}})
	if err != nil {
		t.Fatal(err)
	}
	if res.IsError {
		t.Errorf("result %s", textOf(res))
	}
	waitProgress(t, ev, "started, attempt 2")

	// A client that gives up on a call closes its request: the execution is
	// cancelled.
	ctx, cancel := context.WithCancel(testCtx(t))
	errc := make(chan error, 1)
	go func() {
		_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "test.block", Arguments: map[string]any{"note": "s"}})
		errc <- err
	}()
	id := <-f.started
	cancel()
	<-errc
	env, err := f.client.Await(testCtx(t), id)
	if err != nil {
		t.Fatal(err)
	}
	if env.Status != envelope.StatusCancelled {
		t.Errorf("after the client gave up: %s", env.Status)
	}

	f.runWorker(t, "late", executor.Define("test.late", executor.Meta{
		Description: "Served late.", Expose: executor.On(executor.SurfaceMCP), SideEffect: executor.SideEffectNone,
	}, func(ctx context.Context, c executor.Call[blockIn]) (string, error) { return "late", nil }))
	waitChanged(t, ev, cs, "test.late", true)
}

// breakable is a client transport whose connection the test can break, as
// a host that dies breaks its pipe (a session's Close would wait for the
// calls in flight).
type breakable struct {
	mcp.Transport
	conn chan mcp.Connection
}

func (b *breakable) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := b.Transport.Connect(ctx)
	if err == nil {
		b.conn <- c
	}
	return c, err
}

func TestDisconnect_TheExecutionGoesOn_StatusReadsItsResult(t *testing.T) {
	t.Parallel()
	f := start(t, mcpbridge.Config{})
	ctx := testCtx(t)
	srv, err := f.bridge.Server(ctx, alice)
	if err != nil {
		t.Fatal(err)
	}
	ct, st := mcp.NewInMemoryTransports()
	ss, err := srv.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Close()
	tr := &breakable{Transport: ct, conn: make(chan mcp.Connection, 1)}
	first, err := mcp.NewClient(&mcp.Implementation{Name: "dies", Version: "v0"}, nil).Connect(ctx, tr, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	conn := <-tr.conn
	callDone := make(chan struct{})
	go func() {
		defer close(callDone)
		_, _ = first.CallTool(ctx, &mcp.CallToolParams{Name: "test.gate", Arguments: map[string]any{"note": "gone"}})
	}()
	id := <-f.started
	_ = conn.Close() // the host goes away mid-call
	<-callDone
	f.gate <- struct{}{}
	env, err := f.client.Await(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if env.Status != envelope.StatusCompleted {
		t.Fatalf("after a disconnect the execution ended %s", env.Status)
	}
	again := f.connectMemory(t, alice, newEvents())
	res, err := again.CallTool(ctx, &mcp.CallToolParams{Name: mcpbridge.StatusTool, Arguments: map[string]any{"executionId": id}})
	if err != nil {
		t.Fatal(err)
	}
	if res.IsError || textOf(res) != `"through gone"` {
		t.Errorf("capstan.status = %s", textOf(res))
	}
	other := f.connectMemory(t, bob, newEvents())
	res, err = other.CallTool(ctx, &mcp.CallToolParams{Name: mcpbridge.StatusTool, Arguments: map[string]any{"executionId": id}})
	if err != nil {
		t.Fatal(err)
	}
	if !res.IsError || strings.Contains(textOf(res), "through") {
		t.Errorf("bob read alice's execution: %s", textOf(res))
	}
}

func TestCallTimeout_AnswersStillRunningWithTheExecutionID(t *testing.T) {
	t.Parallel()
	f := start(t, mcpbridge.Config{CallTimeout: 100 * time.Millisecond})
	ctx := testCtx(t)
	cs := f.connectMemory(t, alice, newEvents())
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "test.gate", Arguments: map[string]any{"note": "later"}})
	if err != nil {
		t.Fatal(err)
	}
	id := <-f.started
	sr := structured(t, res)
	if res.IsError || sr["status"] != "running" || sr["executionId"] != id {
		t.Fatalf("a call outliving CallTimeout = %v", sr)
	}
	f.gate <- struct{}{}
	if _, err := f.client.Await(ctx, id); err != nil {
		t.Fatal(err)
	}
	res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: mcpbridge.StatusTool, Arguments: map[string]any{"executionId": id}})
	if err != nil {
		t.Fatal(err)
	}
	if textOf(res) != `"through later"` {
		t.Errorf("capstan.status = %s", textOf(res))
	}
}

func TestProgress_FromRecords_WhenTheAuditStreamIsNotReadable(t *testing.T) {
	t.Parallel()
	f := start(t, mcpbridge.Config{ProgressFromRecords: true})
	ev := newEvents()
	cs := f.connectMemory(t, alice, ev)
	resc := make(chan *mcp.CallToolResult, 1)
	go func() {
		res, err := cs.CallTool(testCtx(t), &mcp.CallToolParams{Name: "test.gate", Arguments: map[string]any{"note": "r"},
			Meta: mcp.Meta{"progressToken": "r"}})
		if err != nil {
			t.Error(err)
		}
		resc <- res
	}()
	<-f.started
	waitProgress(t, ev, "queued")
	waitProgress(t, ev, "started, attempt 1")
	f.gate <- struct{}{}
	if res := <-resc; res == nil || res.IsError {
		t.Fatalf("result %+v", res)
	}
	waitProgress(t, ev, "completed")
}

// A call the bridge answered "still running" may still be queued, no worker
// having taken it: capstan.status says it is queued, not that there is no
// such execution, and reads its result once a worker has run it.
func TestStatus_AQueuedCallIsQueuedNotUnknown(t *testing.T) {
	t.Parallel()
	f := start(t, mcpbridge.Config{CallTimeout: 200 * time.Millisecond})
	ctx := testCtx(t)
	later := executor.Define("test.later", executor.Meta{
		Description: "Served by a pool whose worker comes later.", Expose: executor.On(executor.SurfaceMCP),
		SideEffect: executor.SideEffectNone,
	}, func(ctx context.Context, c executor.Call[blockIn]) (string, error) { return "ran " + c.Input.Note, nil })
	f.runWorker(t, "later", later)() // listed in the catalog, then gone
	cs := f.connectMemory(t, alice, newEvents())
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "test_later", Arguments: map[string]any{"note": "queued"}})
	if err != nil {
		t.Fatal(err)
	}
	sr := structured(t, res)
	id, _ := sr["executionId"].(string)
	if res.IsError || sr["status"] != "running" || id == "" {
		t.Fatalf("a call no worker takes = %s", textOf(res))
	}
	res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: mcpbridge.StatusTool, Arguments: map[string]any{"executionId": id}})
	if err != nil {
		t.Fatal(err)
	}
	if res.IsError || !strings.Contains(textOf(res), "queued") {
		t.Errorf("status of a queued call = %s", textOf(res))
	}
	f.runWorker(t, "later", later)
	if _, err := f.client.Await(ctx, id); err != nil {
		t.Fatal(err)
	}
	res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: mcpbridge.StatusTool, Arguments: map[string]any{"executionId": id}})
	if err != nil {
		t.Fatal(err)
	}
	if textOf(res) != `"ran queued"` {
		t.Errorf("status once run = %s", textOf(res))
	}
}

// An operator's pause reaches the hosts: the paused tool's description says
// so, with list_changed, and says so no more once it is lifted.
func TestListChanged_WhenAnOperatorPausesATool(t *testing.T) {
	t.Parallel()
	f := start(t, mcpbridge.Config{})
	ev := newEvents()
	mem := f.connectMemory(t, alice, ev)
	tool := mcpbridge.ToolName("email.send", mcpbridge.ToolNamesPortable)
	desc := func() string {
		r, err := mem.ListTools(testCtx(t), nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, tl := range r.Tools {
			if tl.Name == tool {
				return tl.Description
			}
		}
		t.Fatalf("%s not listed", tool)
		return ""
	}
	if d := desc(); strings.Contains(d, "PAUSED") {
		t.Fatalf("listed paused before any pause: %s", d)
	}
	names := broker.NewNames("")
	ch, err := pauses.Apply(testCtx(t), f.nc, names, &pauses.Pause{Scope: pauses.Scope{Capability: "email.send"},
		Mode: pauses.Hold, Reason: "mail to the wrong list", By: broker.Anonymous})
	if err != nil {
		t.Fatal(err)
	}
	waitDescription(t, ev, desc, true)
	if d := desc(); !strings.Contains(d, "mail to the wrong list") || !strings.Contains(d, "wait until it is lifted") {
		t.Errorf("paused tool's description: %s", d)
	}
	if _, err := pauses.Lift(testCtx(t), f.nc, names, ch.Pause.Scope, broker.Anonymous, "", "fixed"); err != nil {
		t.Fatal(err)
	}
	waitDescription(t, ev, desc, false)
}

// waitDescription waits for list_changed notifications until the paused
// tool's description says PAUSED (or no more).
func waitDescription(t *testing.T, ev *events, desc func() string, paused bool) {
	t.Helper()
	ctx := testCtx(t)
	for {
		select {
		case <-ev.changed:
			if strings.Contains(desc(), "PAUSED") == paused {
				return
			}
		case <-ctx.Done():
			t.Fatalf("no list_changed after which the tool is paused=%v: %s", paused, desc())
		}
	}
}
