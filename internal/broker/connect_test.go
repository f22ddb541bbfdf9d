package broker_test

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/nats-io/nats.go/jetstream"
)

func TestConnect_BadOptionsAreClearErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	missingCreds := filepath.Join(dir, "missing.creds")
	missingCA := filepath.Join(dir, "missing-ca.pem")
	for _, tc := range []struct {
		name string
		o    broker.ConnectOptions
		says []string
		is   error
	}{
		{"credentials file missing", broker.ConnectOptions{Creds: missingCreds}, []string{"credentials file", missingCreds}, fs.ErrNotExist},
		{"CA file missing", broker.ConnectOptions{TLSCA: missingCA}, []string{missingCA}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Nothing listens there: every one of these must fail before dialing
			// or name its own cause, not a connection refusal.
			tc.o.URL = "nats://127.0.0.1:1"
			tc.o.Timeout = time.Second
			nc, err := broker.Connect(tc.o)
			if err == nil {
				nc.Close()
				t.Fatal("connected")
			}
			t.Logf("Connect: %v", err)
			for _, want := range tc.says {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Errorf("error %v is not %v", err, tc.is)
			}
		})
	}
}

func TestConnect_NothingListeningNamesTheURL(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "nats://" + l.Addr().String()
	_ = l.Close()
	nc, err := broker.Connect(broker.ConnectOptions{URL: url, Timeout: time.Second})
	if err == nil {
		nc.Close()
		t.Fatal("connected to a closed port")
	}
	if !strings.Contains(err.Error(), url) {
		t.Errorf("error %q does not name %s", err, url)
	}
}

func TestConnect_SingleServer(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	nc, err := broker.Connect(broker.ConnectOptions{URL: env.URL, Name: "capstan-test"})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if !nc.IsConnected() || nc.Opts.Name != "capstan-test" {
		t.Fatalf("connected %v as %q", nc.IsConnected(), nc.Opts.Name)
	}
	if nc.Opts.MaxReconnect != -1 {
		t.Errorf("max reconnects %d, want -1 (forever)", nc.Opts.MaxReconnect)
	}
}

// Several comma-separated URLs, spaces allowed: Connect reaches the cluster
// through any live one, and a connection whose server dies moves to another.
func TestConnect_CommaSeparatedURLsOfACluster(t *testing.T) {
	t.Parallel()
	c := testenv.StartCluster(t, 3)
	// The first URL's server is gone; the others carry the connection.
	c.StopNode(0)
	nc, err := broker.Connect(broker.ConnectOptions{URL: strings.Join(c.URLs, " , "), Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	servers := nc.Servers()
	for _, u := range c.URLs {
		if !slices.ContainsFunc(servers, func(s string) bool { return sameHostPort(s, u) }) {
			t.Errorf("server pool %v lacks %s", servers, u)
		}
	}
	first := nc.ConnectedServerName()
	if first == c.Nodes[0].Server.Name() || first == "" {
		t.Fatalf("connected to %q", first)
	}

	for i, node := range c.Nodes {
		if node.Server.Name() == first {
			c.StopNode(i)
		}
	}
	ctx := testCtx(t)
	for nc.ConnectedServerName() == first || !nc.IsConnected() {
		select {
		case <-ctx.Done():
			t.Fatalf("did not reconnect away from %s: %v", first, nc.Status())
		case <-time.After(20 * time.Millisecond):
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatalf("flush after reconnect: %v", err)
	}
}

func sameHostPort(a, b string) bool {
	trim := func(s string) string { return strings.TrimPrefix(s, "nats://") }
	return trim(a) == trim(b)
}

// A server that speaks only TLS and asks for a client certificate: a client
// with the certificate in ConnectOptions.TLS and the root in TLSCA connects
// and uses JetStream; without the certificate, or without the root, the
// server or the client refuses the handshake.
func TestConnect_ClientCertificate(t *testing.T) {
	t.Parallel()
	opt, files := testenv.MutualTLS(t)
	env := testenv.Start(t, opt)
	withCert := files.ClientTLS(t)
	nc, err := broker.Connect(broker.ConnectOptions{URL: env.URL, TLS: withCert, TLSCA: files.CA, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("with the client certificate: %v", err)
	}
	defer nc.Close()
	if !nc.TLSRequired() {
		t.Error("the connection does not say the server requires TLS")
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.AccountInfo(t.Context()); err != nil {
		t.Errorf("JetStream over the client certificate's connection: %v", err)
	}
	if withCert.RootCAs != nil {
		t.Error("Connect changed the caller's TLS configuration")
	}
	for name, o := range map[string]broker.ConnectOptions{
		"no client certificate": {TLSCA: files.CA},
		"no root":               {TLS: withCert},
	} {
		o.URL, o.Timeout = env.URL, 5*time.Second
		if nc, err := broker.Connect(o); err == nil {
			nc.Close()
			t.Errorf("%s: connected", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
}

// A credentials file that is missing is no server that has not answered yet:
// ConnectWait says so at once instead of waiting for the file to appear.
func TestConnectWait_MissingCredentialsFileIsNotWaitedFor(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	missing := filepath.Join(t.TempDir(), "missing.creds")
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		nc, err := broker.ConnectWait(ctx, broker.ConnectOptions{URL: env.URL, Creds: missing}, 0, slog.New(slog.DiscardHandler))
		if nc != nil {
			nc.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), missing) {
			t.Errorf("ConnectWait: %v, want the missing file named", err)
		}
	case <-time.After(time.Minute):
		cancel()
		t.Fatalf("ConnectWait still waiting for a missing credentials file: %v", <-done)
	}
	if broker.Unreachable(&fs.PathError{Op: "open", Path: missing, Err: fs.ErrNotExist}) {
		t.Error("a missing file reads as an unreachable server")
	}
}
