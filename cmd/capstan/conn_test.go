package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/capstan-dev/capstan/auth"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// A NATS URL may carry a user and password or a token: a connection error
// names the server without them.
func TestConnectionError_URLSecretsNotPrinted(t *testing.T) {
	t.Parallel()
	port := freePort(t) // nothing listens there
	for _, url := range []string{
		fmt.Sprintf("nats://alice:s3cret-pass@127.0.0.1:%d", port),
		fmt.Sprintf("nats://s3cret-token@127.0.0.1:%d", port),
		fmt.Sprintf("nats://127.0.0.1:1,nats://bob:s3cret-pass@127.0.0.1:%d", port),
	} {
		for _, args := range [][]string{
			{"call", "demo.echo"},
			{"status", envelope.NewExecutionID()},
		} {
			stdout, stderr, code := capstan(t, url, args...)
			if code != exitUsage {
				t.Fatalf("%s via %s: exit %d, want %d; stdout %s stderr %s", args[0], url, code, exitUsage, stdout, stderr)
			}
			if strings.Contains(stderr, "s3cret") || strings.Contains(stdout, "s3cret") {
				t.Fatalf("%s via %s printed the secret:\n%s%s", args[0], url, stdout, stderr)
			}
			if !strings.Contains(stderr, fmt.Sprintf("127.0.0.1:%d", port)) {
				t.Fatalf("%s via %s: the error does not name the server:\n%s", args[0], url, stderr)
			}
		}
	}
}

// A command opens one connection to the server: what listens at the URL is
// judged by that connection's greeting, and the credentials read once
// authenticate it (the server counts every connection it accepts, one that
// only looks at the greeting too).
func TestCommand_OpensOneConnection(t *testing.T) {
	t.Parallel()
	setup, err := auth.Init(filepath.Join(t.TempDir(), "secrets"), "")
	if err != nil {
		t.Fatal(err)
	}
	if err := setup.Add(auth.Grant{Principal: "alice", Role: auth.RoleProducer, Actors: []string{"user:alice"}, Capabilities: []string{"*"}}); err != nil {
		t.Fatal(err)
	}
	env := testenv.Start(t, testenv.Auth(setup))
	if _, err := broker.Provision(t.Context(), env.Connect(t), broker.Config{}); err != nil {
		t.Fatal(err)
	}
	accepted := func() int64 {
		v, err := env.Server.Varz(&server.VarzOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return int64(v.TotalConnections)
	}
	before := accepted()
	_, stderr, code := capstan(t, env.URL, "status", envelope.NewExecutionID(), "--creds", setup.CredsPath("alice"))
	if strings.Contains(stderr, "connect to") || strings.Contains(stderr, "credentials") {
		t.Fatalf("status did not connect as alice: exit %d: %s", code, stderr)
	}
	if n := accepted() - before; n != 1 {
		t.Fatalf("status opened %d connections, want 1 (exit %d: %s)", n, code, stderr)
	}
}

// --tls-cert and --tls-key reach a server that asks for a client
// certificate; without them the server refuses, and a pair given by half or
// a file missing is said before anything is dialed.
func TestConnect_ClientCertificateFlags(t *testing.T) {
	t.Parallel()
	opt, files := testenv.MutualTLS(t)
	env := testenv.Start(t, opt)
	nc, err := broker.Connect(broker.ConnectOptions{URL: env.URL, TLSCA: files.CA, TLS: files.ClientTLS(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := broker.Provision(t.Context(), nc, broker.Config{}); err != nil {
		t.Fatal(err)
	}
	id := envelope.NewExecutionID()
	tlsFlags := []string{"--tls-ca", files.CA, "--tls-cert", files.Cert, "--tls-key", files.Key}
	stdout, stderr, code := capstan(t, env.URL, append([]string{"status", id}, tlsFlags...)...)
	if code != exitUnknown || !strings.Contains(stderr+stdout, id) {
		t.Errorf("status over the client certificate: exit %d, want %d naming the id; stdout %s stderr %s", code, exitUnknown, stdout, stderr)
	}
	missing := filepath.Join(t.TempDir(), "missing.pem")
	for _, tc := range []struct {
		name  string
		flags []string
		says  string
	}{
		{"no client certificate", []string{"--tls-ca", files.CA}, "tls"},
		{"certificate without key", []string{"--tls-ca", files.CA, "--tls-cert", files.Cert}, "--tls-cert and --tls-key go together"},
		{"key without certificate", []string{"--tls-ca", files.CA, "--tls-key", files.Key}, "--tls-cert and --tls-key go together"},
		{"certificate file missing", []string{"--tls-ca", files.CA, "--tls-cert", missing, "--tls-key", files.Key}, missing},
	} {
		stdout, stderr, code := capstan(t, env.URL, append([]string{"status", id}, tc.flags...)...)
		if code != exitUsage || !strings.Contains(stderr, tc.says) {
			t.Errorf("%s: exit %d, want %d saying %q; stdout %s stderr %s", tc.name, code, exitUsage, tc.says, stdout, stderr)
		}
	}
}
