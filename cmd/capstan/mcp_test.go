package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
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
	for _, want := range []string{"demo_echo", "orders_refund", "capstan_resume"} {
		if !slices.Contains(names, want) {
			t.Errorf("tools/list = %v, lacks %s", names, want)
		}
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "demo_echo", Arguments: map[string]any{"via": "stdio"}})
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

// Bearer tokens never travel in clear beyond this machine by default: the
// bridge refuses plain HTTP beyond loopback unless told --insecure, and a
// tokens file others may read.
func TestMCP_RefusesPlainHTTPBeyondLoopbackAndLooseTokens(t *testing.T) {
	t.Parallel()
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte("s3cr3t-token-for-a-test user:ada\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	beyond := fmt.Sprintf("0.0.0.0:%d", freePort(t))
	for _, args := range [][]string{
		{"mcp", "--http", beyond, "--tokens", tokens},
		{"mcp", "--http", ":" + strconv.Itoa(freePort(t)), "--tokens", tokens},
		{"dev", "--store", t.TempDir(), "--listen", "127.0.0.1:0", "--mcp", beyond},
	} {
		_, stderr, code := capstan(t, "nats://127.0.0.1:1", args...)
		if code != exitUsage || !strings.Contains(stderr, "plain HTTP") || !strings.Contains(stderr, "https-cert") || !strings.Contains(stderr, "--insecure") {
			t.Fatalf("%v: exit %d: %s", args, code, stderr)
		}
	}
	if err := os.Chmod(tokens, 0o644); err != nil {
		t.Fatal(err)
	}
	_, stderr, code := capstan(t, "nats://127.0.0.1:1", "mcp", "--http", "127.0.0.1:0", "--tokens", tokens)
	if code != exitUsage || !strings.Contains(stderr, "chmod 600 "+tokens) || strings.Contains(stderr, "s3cr3t") {
		t.Fatalf("a tokens file others may read: exit %d: %s", code, stderr)
	}
}

// With a certificate, the bridge serves HTTPS, and may then listen beyond
// loopback (here it listens on loopback: tests stay on this machine).
func TestMCP_ServesHTTPS(t *testing.T) {
	t.Parallel()
	_, natsURL := startDev(t)
	certFile, keyFile, der := selfSigned(t, "mcp.test")
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte("tok-https-0123456789 user:ada\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	d := startDaemon(t, "capstan mcp serving", []string{"CAPSTAN_NATS_URL=" + natsURL},
		"mcp", "--http", fmt.Sprintf("127.0.0.1:%d", port), "--tokens", tokens, "--https-cert", certFile, "--https-key", keyFile)
	if !strings.Contains(d.out.String(), fmt.Sprintf("https://127.0.0.1:%d/mcp", port)) {
		t.Fatalf("not served over HTTPS:\n%s", d.out.String())
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	tr := &mcp.StreamableClientTransport{Endpoint: fmt.Sprintf("https://127.0.0.1:%d/mcp", port),
		HTTPClient: &http.Client{Transport: bearerOver("tok-https-0123456789", &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}})}}
	ctx := mcpCtx(t)
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "host", Version: "v0"}, nil).Connect(ctx, tr, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "demo.echo", Arguments: map[string]any{"via": "https"}})
	if err != nil || res.IsError {
		t.Fatalf("%v %+v", err, res)
	}
}

// bearerOver sends a bearer token through next.
type bearerOverTransport struct {
	token string
	next  http.RoundTripper
}

func bearerOver(token string, next http.RoundTripper) http.RoundTripper {
	return bearerOverTransport{token, next}
}

func (b bearerOverTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}
