package auth_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/auth"
	"github.com/capstan-dev/capstan/capstantest"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// officialBinary is an official nats-server, built once from the module
// this one depends on.
var officialBinary struct {
	once sync.Once
	dir  string
	path string
	err  error
	out  []byte
}

// natsServerBinary returns the path of the official nats-server binary,
// building it on first use; the test is skipped in -short mode or without
// a go command.
func natsServerBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds nats-server")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to build nats-server with")
	}
	b := &officialBinary
	b.once.Do(func() {
		if b.dir, b.err = os.MkdirTemp("", "capstan-nats-server-"); b.err != nil {
			return
		}
		b.path = filepath.Join(b.dir, "nats-server")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		b.out, b.err = exec.CommandContext(ctx, goBin, "build", "-o", b.path, "github.com/nats-io/nats-server/v2").CombinedOutput()
	})
	if b.err != nil {
		t.Fatalf("build nats-server: %v\n%s", b.err, b.out)
	}
	return b.path
}

// startOfficial runs setup's generated nats-server.conf on the official
// binary exactly as a deployment would (nats-server -c conf -p PORT -js -sd
// DIR), and returns its URL. Nothing is pushed yet.
func startOfficial(t *testing.T, setup *auth.Setup) string {
	t.Helper()
	bin := natsServerBinary(t)
	port := freePort(t)
	srv := exec.Command(bin, "-c", setup.ServerConfigPath(), "-a", "127.0.0.1", "-p", strconv.Itoa(port), "-js", "-sd", t.TempDir())
	var log bytes.Buffer
	srv.Stdout, srv.Stderr = &log, &log
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = srv.Process.Kill()
		_ = srv.Wait()
		if t.Failed() {
			t.Logf("nats-server log:\n%s", log.String())
		}
	})
	url := "nats://127.0.0.1:" + strconv.Itoa(port)
	connectWhenUp(t, testCtx(t), url, setup, auth.AdminPrincipal).Close()
	return url
}

// pushTo pushes setup's accounts to the server at url, as capstan auth push does.
func pushTo(t *testing.T, url string, setup *auth.Setup) {
	t.Helper()
	nc := connectWhenUp(t, testCtx(t), url, setup, auth.PushUser)
	defer nc.Close()
	if _, err := auth.PushAccounts(testCtx(t), nc, setup); err != nil {
		t.Fatal(err)
	}
}

// TestServerConfig_OfficialNatsServer runs the generated configuration on an
// official nats-server: a principal connects only once its account is
// pushed, publishes under its own token only, and a call runs through it.
func TestServerConfig_OfficialNatsServer(t *testing.T) {
	t.Parallel()
	setup, err := auth.Init(t.TempDir(), "")
	if err != nil {
		t.Fatal(err)
	}
	if err := setup.Add(auth.Grant{Principal: "alice", Role: auth.RoleProducer, Actors: []string{"user:alice"}, Capabilities: []string{"*"}}); err != nil {
		t.Fatal(err)
	}
	url := startOfficial(t, setup)
	ctx := testCtx(t)
	// Before the push the server does not know alice's account.
	if nc, err := nats.Connect(url, nats.UserCredentials(setup.CredsPath("alice")), nats.MaxReconnects(0)); err == nil {
		nc.Close()
		t.Fatal("alice connected before her account was pushed")
	}
	pushTo(t, url, setup)

	admin := connectWhenUp(t, ctx, url, setup, auth.AdminPrincipal)
	b, err := broker.Provision(ctx, admin, broker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := auth.PublishGrants(ctx, b.JS, setup, 0); err != nil {
		t.Fatal(err)
	}
	if nc, err := nats.Connect(url, nats.MaxReconnects(0)); err == nil {
		nc.Close()
		t.Fatal("a client without credentials connected")
	}
	v := newViolations()
	alice := connectWhenUp(t, ctx, url, setup, "alice", v.handler())
	js, err := jetstream.New(alice)
	if err != nil {
		t.Fatal(err)
	}
	n := broker.NewNames(setup.Prefix)
	if _, err := js.Publish(ctx, n.ExecSubject("alice", "demo.echo"), []byte("x")); err != nil {
		t.Fatalf("alice's own request refused: %v", err)
	}
	for _, subject := range []string{
		n.ExecSubject("bob", "demo.echo"),
		"$KV." + n.EnvelopesBucket() + ".alice.0198",
		"$KV." + n.ApprovalsBucket() + ".a1",
		n.AuditSubject("0198"),
	} {
		if err := alice.Publish(subject, []byte("forged")); err != nil {
			t.Fatal(err)
		}
		v.wait(t, ctx, subject)
	}
	if err := b.Audit.Purge(ctx); err == nil {
		t.Fatal("audit stream purged")
	}
	queue, err := b.JS.Stream(ctx, n.QueueStream("alice"))
	if err != nil || queue.CachedInfo().State.Msgs != 1 {
		t.Fatalf("alice's queue: %v", err)
	}

	// A worker and a producer through the official server: a call runs, a
	// forged actor is refused by the worker.
	echo := executor.Define("demo.echo", executor.Meta{Description: "Echoes.", Expose: executor.On(executor.SurfaceDirect),
		SideEffect: executor.SideEffectNone}, func(ctx context.Context, c executor.Call[Echo]) (Echo, error) { return c.Input, nil })
	reg, err := executor.NewRegistry(echo)
	if err != nil {
		t.Fatal(err)
	}
	capstantest.Worker(t, reg, capstantest.WithConn(connectWhenUp(t, ctx, url, setup, auth.WorkerPrincipal)))
	c, err := executor.NewClient(alice, executor.ClientConfig{Actor: envelope.Actor{Kind: "user", ID: "alice"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	env, err := c.Call(ctx, "demo.echo", Echo{Text: "hi"})
	if err != nil || env.Status != envelope.StatusCompleted {
		t.Fatalf("%v %+v", err, env)
	}
	env, err = c.Call(ctx, "demo.echo", Echo{Text: "hi"}, executor.As(envelope.Actor{Kind: "user", ID: "bob"}))
	if err != nil || env.Error == nil || env.Error.Code != envelope.CodeForbidden {
		t.Fatalf("as bob: %v %+v", err, env)
	}
}

func freePort(t *testing.T) int { return testenv.FreePort(t) }

// connectWhenUp connects as principal, retrying until the server listens or ctx ends.
func connectWhenUp(t *testing.T, ctx context.Context, url string, setup *auth.Setup, principal string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	all := append([]nats.Option{
		nats.UserCredentials(setup.CredsPath(principal)),
		nats.CustomInboxPrefix(broker.NewNames(setup.Prefix).InboxPrefix(principal)),
		nats.Timeout(time.Second),
	}, opts...)
	for {
		nc, err := nats.Connect(url, all...)
		if err == nil {
			t.Cleanup(nc.Close)
			return nc
		}
		select {
		case <-ctx.Done():
			t.Fatalf("nats-server never accepted %s: %v", principal, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
