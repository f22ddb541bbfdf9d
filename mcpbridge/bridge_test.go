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

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/demo"
	"github.com/capstan-dev/capstan/mcpbridge"
	"github.com/capstan-dev/capstan/testenv"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"
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
	started chan string // execution ids of test.block as they start
}

func start(t *testing.T, cfg mcpbridge.Config) *fixture {
	t.Helper()
	f := &fixture{env: testenv.Start(t), started: make(chan string, 16)}
	f.nc = f.env.Connect(t)
	ctx := testCtx(t)
	js, err := demo.Provision(ctx, f.nc, 0)
	if err != nil {
		t.Fatal(err)
	}
	caps := append(demo.Catalog(js),
		executor.Define("test.block", executor.Meta{
			Description: "Runs until cancelled.", Expose: executor.On(executor.SurfaceMCP),
			SideEffect: executor.Read, Timeout: time.Minute,
		}, func(ctx context.Context, c executor.Call[blockIn]) (string, error) {
			f.started <- c.ExecutionID
			<-ctx.Done()
			return "", ctx.Err()
		}),
		executor.Define("test.direct", executor.Meta{
			Description: "Not exposed on mcp.", Expose: executor.On(executor.SurfaceDirect), SideEffect: executor.None,
		}, func(ctx context.Context, c executor.Call[blockIn]) (string, error) { return "no", nil }),
		executor.Define("test.wipe", executor.Meta{
			Description: "Destructive.", Expose: executor.On(executor.SurfaceMCP), SideEffect: executor.Destructive,
		}, func(ctx context.Context, c executor.Call[blockIn]) (string, error) { return "wiped", nil }),
	)
	f.runWorker(t, "default", caps...)
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
	w, err := executor.NewWorker(nc, reg, executor.WorkerConfig{Pool: pool})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	var once sync.Once
	stopWait := func() { once.Do(func() { stop(); <-done }) }
	t.Cleanup(stopWait)
	// Serving once describe answers and lists the worker's capabilities.
	c, err := executor.NewClient(nc, executor.ClientConfig{Surface: executor.SurfaceDirect})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx2 := testCtx(t)
	for {
		d, err := c.Describe(ctx2, executor.SurfaceDirect, alice, executor.Scope{})
		if err == nil && len(d.Capabilities) > 0 {
			return stopWait
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

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// events collects what a client was told.
type events struct {
	mu       sync.Mutex
	progress []string
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
			e.mu.Unlock()
			select {
			case e.progCh <- r.Params.Message:
			default:
			}
		},
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
	tokens, err := mcpbridge.NewTokens(map[string]envelope.Actor{aliceToken: alice, bobToken: bob})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(f.bridge.Handler(tokens, nil))
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
	f := start(t, mcpbridge.Config{})
	transports(t, f, func(t *testing.T, connect func(envelope.Actor, *events) *mcp.ClientSession) {
		cs := connect(alice, newEvents())
		res, err := cs.ListTools(testCtx(t), nil)
		if err != nil {
			t.Fatal(err)
		}
		byName := map[string]*mcp.Tool{}
		for _, tl := range res.Tools {
			byName[tl.Name] = tl
		}
		for _, want := range []string{"demo.echo", "orders.refund", "email.send", "test.block", "test.wipe",
			mcpbridge.ResumeTool, mcpbridge.StatusTool} {
			if byName[want] == nil {
				t.Errorf("tools/list lacks %s", want)
			}
		}
		if byName["test.direct"] != nil {
			t.Error("a capability not exposed on mcp is listed")
		}
		refund := byName["orders.refund"]
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
		if a := byName["demo.echo"].Annotations; a == nil || !a.ReadOnlyHint {
			t.Errorf("demo.echo annotations = %+v", a)
		}
		if a := byName["test.wipe"].Annotations; a == nil || a.DestructiveHint == nil || !*a.DestructiveHint {
			t.Errorf("test.wipe annotations = %+v", a)
		}
		if a := byName["email.send"].Annotations; a == nil || a.OpenWorldHint == nil || !*a.OpenWorldHint || a.ReadOnlyHint {
			t.Errorf("email.send annotations = %+v", a)
		}
	})
}

func TestToolsCall_CompletedIsStructuredContentAndText(t *testing.T) {
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
