package console_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/console"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/trail"
	"github.com/nats-io/nats.go"
)

// An execution's page shows that its trail, and the envelope with it,
// verifies against the audit log's latest signed checkpoint, with the key
// the console was given; a key that did not sign the log shows it does not.
func TestExecution_TrailVerifiesAgainstTheLatestCheckpoint(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if _, err := trail.Keygen(dir, "test.example/console"); err != nil {
		t.Fatal(err)
	}
	pub, err := os.ReadFile(filepath.Join(dir, trail.PublicKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	r := startRig(t, "", console.Config{Open: true, AuditKeys: string(pub)})
	runCheckpointer(t, r.url, dir)
	echo := r.call(t, "demo.echo", map[string]any{"hello": "world"}, alice)
	w := signInOpen(t, r.base, "user:ops", "")
	body := w.waitPage("/executions/"+echo.ExecutionID, `data-state="verified"`)
	contains(t, "the execution's page", body, "the envelope with it", "test.example/console")

	other := t.TempDir()
	if _, err := trail.Keygen(other, "test.example/console"); err != nil {
		t.Fatal(err)
	}
	otherPub, _ := os.ReadFile(filepath.Join(other, trail.PublicKeyFile))
	w2 := signInOpen(t, serveConsole(t, r.url, console.Config{Open: true, AuditKeys: string(otherPub)}), "user:ops", "")
	_, _, body = w2.get("/executions/" + echo.ExecutionID)
	if !strings.Contains(body, `data-state="failed"`) {
		t.Fatal("a trail verified with a key that did not sign the log")
	}
}

// runCheckpointer signs the log of the server at url with the key in dir
// until the test ends.
func runCheckpointer(t *testing.T, url, dir string) {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	ctx, cancel := context.WithCancel(context.Background())
	b, err := broker.Provision(testCtx(t), nc, broker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	signer, vkey, err := trail.LoadSigner(filepath.Join(dir, trail.KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	known, _, err := trail.LoadVerifiers(filepath.Join(dir, trail.PublicKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	cp := trail.NewCheckpointer(b, signer, vkey, known, trail.Config{Interval: 50 * time.Millisecond})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = cp.Run(ctx) }()
	t.Cleanup(func() { cancel(); wg.Wait() })
}

// serveConsole serves one more console on the server at url until the test
// ends, and returns its base URL.
func serveConsole(t *testing.T, url string, cfg console.Config) string {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	cfg.Conn, cfg.NATS.URL = nc, url
	con, err := console.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- con.Serve(ctx, l) }()
	t.Cleanup(func() { cancel(); <-done })
	return "http://" + l.Addr().String()
}
