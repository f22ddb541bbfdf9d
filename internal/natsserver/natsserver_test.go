package natsserver_test

import (
	"bytes"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/capstan-dev/capstan/internal/natsserver"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func start(t *testing.T, opts natsserver.Options) *server.Server {
	t.Helper()
	s, err := natsserver.Start(opts)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return s
}

func TestStart_AcceptsClientsWithJetStream(t *testing.T) {
	s := start(t, natsserver.Options{StoreDir: t.TempDir(), Port: -1, SyncAlways: true})
	url := natsserver.ClientURL(s)
	if !strings.HasPrefix(url, "nats://127.0.0.1:") {
		t.Fatalf("ClientURL = %q, want a loopback URL", url)
	}
	if !s.JetStreamConfig().SyncAlways {
		t.Fatal("SyncAlways option did not reach the JetStream config")
	}
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer nc.Close()
	// $JS.API.INFO answers only when JetStream is enabled for the account.
	if _, err := nc.Request("$JS.API.INFO", nil, nats.DefaultTimeout); err != nil {
		t.Fatalf("JetStream API: %v", err)
	}
}

func TestStart_RequiresStoreDir(t *testing.T) {
	_, err := natsserver.Start(natsserver.Options{Port: -1})
	if err == nil || !strings.Contains(err.Error(), "StoreDir") {
		t.Fatalf("err = %v, want an error naming StoreDir", err)
	}
}

func TestStart_BusyPortIsAnError(t *testing.T) {
	first := start(t, natsserver.Options{StoreDir: t.TempDir(), Port: -1})
	port := first.Addr().(*net.TCPAddr).Port
	s, err := natsserver.Start(natsserver.Options{StoreDir: t.TempDir(), Port: port})
	if err == nil {
		s.Shutdown()
		s.WaitForShutdown()
		t.Fatal("second server on a busy port started")
	}
	if !strings.Contains(err.Error(), "listening") {
		t.Fatalf("err = %v, want the server's listen error", err)
	}
}

func TestStart_InvalidRouteIsAnError(t *testing.T) {
	_, err := natsserver.Start(natsserver.Options{StoreDir: t.TempDir(), Port: -1, ClusterPort: -1, Routes: []string{"::bad"}})
	if err == nil || !strings.Contains(err.Error(), "route") {
		t.Fatalf("err = %v, want an invalid route error", err)
	}
}

// syncBuffer is a bytes.Buffer safe for the server's logging goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func TestStart_LogsToSlog(t *testing.T) {
	var out syncBuffer
	logger := slog.New(slog.NewTextHandler(&out, nil))
	start(t, natsserver.Options{StoreDir: t.TempDir(), Port: -1, Logger: logger})
	if !strings.Contains(out.String(), "Starting nats-server") {
		t.Fatalf("server logs did not reach the slog logger:\n%s", out.String())
	}
}
