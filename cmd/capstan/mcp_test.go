package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

func mcpCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	t.Cleanup(cancel)
	return ctx
}

func TestMCP_StdioServesTheCatalogToAnSDKClient(t *testing.T) {
	t.Parallel()
	_, url := startDev(t)
	ctx := mcpCtx(t)
	cmd := exec.Command(bin, "mcp", "--actor", "user:ada")
	cmd.Env = append(os.Environ(), "CAPSTAN_NATS_URL="+url)
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "host", Version: "v0"}, nil).
		Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	tools, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range tools.Tools {
		names = append(names, tl.Name)
	}
	for _, want := range []string{"demo.echo", "orders.refund", "capstan.resume"} {
		if !slices.Contains(names, want) {
			t.Errorf("tools/list = %v, lacks %s", names, want)
		}
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "demo.echo", Arguments: map[string]any{"via": "stdio"}})
	if err != nil {
		t.Fatal(err)
	}
	if res.IsError || res.Content[0].(*mcp.TextContent).Text != `{"via":"stdio"}` {
		t.Errorf("tools/call = %+v", res)
	}
	// The host closes stdin: the process ends cleanly.
	if err := cs.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	if cmd.ProcessState == nil || cmd.ProcessState.ExitCode() != 0 {
		t.Errorf("capstan mcp did not exit 0: %v", cmd.ProcessState)
	}
}

func TestMCP_HTTPWithoutTokensRefusesToStart(t *testing.T) {
	t.Parallel()
	_, stderr, code := capstan(t, "nats://127.0.0.1:1", "mcp", "--http", "127.0.0.1:0")
	if code != exitUsage || !strings.Contains(stderr, "no tools") {
		t.Errorf("exit %d, stderr %s", code, stderr)
	}
}

func TestDev_MCPFlagServesHTTPWithABearerToken(t *testing.T) {
	t.Parallel()
	port := freePort(t)
	d := startDaemon(t, "bearer token for", nil, "dev", "--store", t.TempDir(), "--listen", "127.0.0.1:0",
		"--mcp", fmt.Sprintf("127.0.0.1:%d", port), "--grace", "5s")
	m := regexp.MustCompile(`MCP \(streamable HTTP\) on (\S+)\n\s+bearer token for \S+: (\S+)`).FindStringSubmatch(d.out.String())
	if m == nil {
		t.Fatalf("no MCP URL and token in the banner:\n%s", d.out.String())
	}
	endpoint, token := m[1], m[2]
	ctx := mcpCtx(t)

	resp, err := http.Post(endpoint, "application/json", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("without a token: status %d", resp.StatusCode)
	}

	tr := &mcp.StreamableClientTransport{Endpoint: endpoint,
		HTTPClient: &http.Client{Transport: bearerTransport(token)}}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "host", Version: "v0"}, nil).Connect(ctx, tr, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "demo.echo", Arguments: map[string]any{"via": "http"}})
	if err != nil {
		t.Fatal(err)
	}
	if res.IsError || res.Content[0].(*mcp.TextContent).Text != `{"via":"http"}` {
		t.Errorf("tools/call = %+v", res)
	}
	_ = cs.Close()
	if code := d.stop(t); code != 0 {
		t.Fatalf("dev exited %d after SIGTERM", code)
	}
}

type bearerTransport string

func (b bearerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+string(b))
	return http.DefaultTransport.RoundTrip(r)
}
