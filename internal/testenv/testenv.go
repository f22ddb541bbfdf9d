package testenv

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/auth"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/credfile"
	"github.com/capstan-dev/capstan/internal/natsserver"
)

// Env is one embedded JetStream server for a test.
type Env struct {
	// URL is the server's client URL, on loopback.
	URL string
	// StoreDir is its JetStream store, removed when the test ends.
	StoreDir string
	// Server is the embedded server itself.
	Server *server.Server

	opts natsserver.Options
}

// Option changes how a server is started.
type Option func(*options)

// options are the embedded server's.
type options = natsserver.Options

// SyncAlways makes JetStream fsync every write before acknowledging it.
func SyncAlways() Option { return func(o *options) { o.SyncAlways = true } }

// Auth starts the server with setup's configuration: every client then needs
// credentials. Connect connects as the setup's admin, ConnectAs as any of its
// principals. The server keeps accounts in its store directory, and the
// setup's accounts are pushed to it once it is up (see PushAccounts).
func Auth(setup *auth.Setup) Option {
	return func(o *options) {
		o.ConfigFile = setup.ServerConfigPath()
		o.ResolverDir = filepath.Join(o.StoreDir, credfile.ResolverDirName)
	}
}

// Start starts a JetStream server with a file store under t.TempDir() on a random
// loopback port. It is shut down when the test ends.
func Start(t testing.TB, opts ...Option) *Env {
	t.Helper()
	e := &Env{opts: natsserver.Options{StoreDir: t.TempDir(), Port: FreePort(t)}}
	for _, o := range opts {
		o(&e.opts)
	}
	e.start(t)
	e.PushAccounts(t)
	// Later restarts reuse the port, so clients given e.URL find the server again.
	e.opts.Port = e.Server.Addr().(*net.TCPAddr).Port
	t.Cleanup(e.Stop)
	return e
}

func (e *Env) start(t testing.TB) {
	t.Helper()
	s, err := natsserver.Start(e.opts)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	e.Server = s
	e.StoreDir = e.opts.StoreDir
	e.URL = natsserver.ClientURL(s)
}

// Connect connects to the server with options suited to tests (reconnect forever,
// quickly); opts are applied after them. The connection is closed when the test ends.
func (e *Env) Connect(t testing.TB, opts ...nats.Option) *nats.Conn {
	t.Helper()
	return connect(t, e.URL, append(adminCreds(t, e.opts), opts...))
}

// ConnectAs connects as principal of the server's auth setup (see Auth), with
// its credentials and reply prefix.
func (e *Env) ConnectAs(t testing.TB, principal string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	return connect(t, e.URL, append(principalCreds(t, e.opts, principal), opts...))
}

// adminCreds are the options of an admin connection to a server started with
// Auth, none for an open server.
func adminCreds(t testing.TB, o natsserver.Options) []nats.Option {
	t.Helper()
	if o.ConfigFile == "" {
		return nil
	}
	return principalCreds(t, o, auth.AdminPrincipal)
}

func principalCreds(t testing.TB, o natsserver.Options, principal string) []nats.Option {
	t.Helper()
	if o.ConfigFile == "" {
		t.Fatalf("testenv: ConnectAs(%q) on a server started without Auth", principal)
	}
	setup, err := auth.Load(filepath.Dir(o.ConfigFile))
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return []nats.Option{
		nats.UserCredentials(setup.CredsPath(principal)),
		nats.CustomInboxPrefix(broker.NewNames(setup.Prefix).InboxPrefix(principal)),
	}
}

// PushAccounts sends the accounts of the server's auth setup (see Auth),
// as it is now, to the server: principals added or removed since it
// started take effect. Nothing on a server started without Auth.
func (e *Env) PushAccounts(t testing.TB) { t.Helper(); pushAccounts(t, e.URL, e.opts) }

func pushAccounts(t testing.TB, url string, o natsserver.Options) {
	t.Helper()
	if o.ConfigFile == "" {
		return
	}
	setup, err := auth.Load(filepath.Dir(o.ConfigFile))
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	if setup.Current() != nil {
		return // a one-account setup (LegacySetup): its server takes no pushes
	}
	nc := connect(t, url, []nats.Option{
		nats.UserCredentials(setup.PushCredsPath()),
		nats.CustomInboxPrefix(broker.NewNames(setup.Prefix).InboxPrefix(auth.PushUser)),
	})
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := auth.PushAccounts(ctx, nc, setup); err != nil {
		t.Fatalf("testenv: %v", err)
	}
}

// JetStream returns a JetStream context on a new connection.
func (e *Env) JetStream(t testing.TB) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(e.Connect(t))
	if err != nil {
		t.Fatalf("testenv: jetstream: %v", err)
	}
	return js
}

// Stop shuts the server down now, as if it were lost. Stopping twice is harmless.
func (e *Env) Stop() {
	if e.Server == nil {
		return
	}
	e.Server.Shutdown()
	e.Server.WaitForShutdown()
}

// Restart starts the server again on the same store directory and port, so
// streams and KV buckets survive and connected clients reconnect.
func (e *Env) Restart(t testing.TB) {
	t.Helper()
	e.Stop()
	e.start(t)
}

func connect(t testing.TB, url string, opts []nats.Option) *nats.Conn {
	t.Helper()
	all := append([]nats.Option{
		nats.Name(t.Name()),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(50 * time.Millisecond),
		nats.ReconnectJitter(0, 0),
		nats.Timeout(2 * time.Second),
	}, opts...)
	nc, err := nats.Connect(url, all...)
	if err != nil {
		t.Fatalf("testenv: connect %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func routeURL(port int) string { return fmt.Sprintf("nats://127.0.0.1:%d", port) }
