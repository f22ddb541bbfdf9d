package auth_test

import (
	"bytes"
	"context"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/auth"
	"github.com/capstan-dev/capstan/broker"
	"github.com/capstan-dev/capstan/capstantest"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
)

// TestServerConfig_OfficialNatsServer runs the generated nats-server.conf on
// an official nats-server binary, built from the module this one depends on,
// exactly as a deployment would: nats-server -c conf -p PORT -js -sd DIR.
func TestServerConfig_OfficialNatsServer(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds nats-server")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to build nats-server with")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	bin := filepath.Join(t.TempDir(), "nats-server")
	build := exec.CommandContext(ctx, goBin, "build", "-o", bin, "github.com/nats-io/nats-server/v2")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build nats-server: %v\n%s", err, out)
	}

	setup, err := auth.Init(t.TempDir(), "")
	if err != nil {
		t.Fatal(err)
	}
	if err := setup.Add(auth.Grant{Principal: "alice", Role: auth.Producer, Actors: []string{"user:alice"}, Capabilities: []string{"*"}}); err != nil {
		t.Fatal(err)
	}
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
	n := setup.Names()
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
	info, err := b.Exec.Info(ctx)
	if err != nil || info.State.Msgs != 1 {
		t.Fatalf("exec stream: %v, %+v", err, info)
	}

	// A worker and a producer through the official server: a call runs, a
	// forged actor is refused by the worker.
	echo := executor.Define("demo.echo", executor.Meta{Description: "Echoes.", Expose: executor.On(executor.SurfaceDirect),
		SideEffect: executor.None}, func(ctx context.Context, c executor.Call[Echo]) (Echo, error) { return c.Input, nil })
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

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// connectWhenUp connects as principal, retrying until the server listens or ctx ends.
func connectWhenUp(t *testing.T, ctx context.Context, url string, setup *auth.Setup, principal string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	all := append([]nats.Option{
		nats.UserCredentials(setup.CredsPath(principal)),
		nats.CustomInboxPrefix(setup.Names().InboxPrefix(principal)),
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
