package credfile_test

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"

	"github.com/capstan-dev/capstan/auth"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/credfile"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// Credentials read once are all a connection needs: with the file gone
// after the read, the connection still authenticates as the principal and
// takes its inbox prefix; without the value read, the same connection
// fails for want of the file.
func TestRead_ConnectionUsesTheValueRead(t *testing.T) {
	t.Parallel()
	setup, err := auth.Init(t.TempDir(), "")
	if err != nil {
		t.Fatal(err)
	}
	if err := setup.Add(auth.Grant{Principal: "alice", Role: auth.RoleProducer, Actors: []string{"user:alice"}, Capabilities: []string{"*"}}); err != nil {
		t.Fatal(err)
	}
	env := testenv.Start(t, testenv.Auth(setup))
	b, err := os.ReadFile(setup.CredsPath("alice"))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "alice.creds")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	cr, err := credfile.Read(path)
	if err != nil {
		t.Fatal(err)
	}
	n := broker.NewNames(setup.Prefix)
	if !cr.Known() || cr.Principal != "alice" || cr.Role != string(auth.RoleProducer) {
		t.Fatalf("read %q, role %q, known %v; want alice, producer", cr.Principal, cr.Role, cr.Known())
	}
	if !cr.MayPublish(n.ExecSubject("alice", "demo.echo")) || cr.MayPublish(n.DecideSubject("alice")) {
		t.Fatal("a producer's credentials: may not call, or may decide approvals")
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	o := broker.ConnectOptions{URL: env.URL, Creds: path, Prefix: setup.Prefix}
	if _, err := broker.Connect(o); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("without the value read, connect with the file gone: %v, want it missing", err)
	}
	o.Credentials = cr.Credentials
	nc, err := broker.Connect(o)
	if err != nil {
		t.Fatalf("connect with the value read: %v", err)
	}
	defer nc.Close()
	if p := broker.PrincipalOf(nc, n); p != "alice" {
		t.Fatalf("connected as %q, want alice", p)
	}
	// Credentials read from another file are not taken for this one's.
	o.Creds = filepath.Join(t.TempDir(), "other.creds")
	if _, err := broker.Connect(o); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("credentials of another file: %v, want the named file missing", err)
	}
}

// What is not a capstan principal's credentials is no error of reading: the
// server decides. A file others may read, or none, is.
func TestRead_BadFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct {
		name string
		path string
		is   error // nil: read, and not Known
	}{
		{"missing", filepath.Join(dir, "missing.creds"), fs.ErrNotExist},
		{"not credentials", write("garbage.creds", "this is not a credentials file\n", 0o600), nil},
		{"empty", write("empty.creds", "", 0o600), nil},
		{"truncated JWT", write("truncated.creds", "-----BEGIN NATS USER JWT-----\neyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5LW5rZXkifQ.eyJq\n", 0o600), nil},
		{"readable by others", write("loose.creds", "x", 0o644), broker.ErrReadableByOthers},
	} {
		if errors.Is(tc.is, broker.ErrReadableByOthers) && runtime.GOOS == "windows" {
			continue
		}
		cr, err := credfile.Read(tc.path)
		if tc.is != nil {
			if !errors.Is(err, tc.is) {
				t.Errorf("%s: %v, want %v", tc.name, err, tc.is)
			}
			continue
		}
		if err != nil || cr.Known() || cr.Principal != "" || cr.Role != "" || !cr.MayPublish("anything") {
			t.Errorf("%s: err %v, known %v, principal %q, role %q: want read, unknown, the server deciding", tc.name, err, cr.Known(), cr.Principal, cr.Role)
		}
	}
}

// A reconnect reads the file again, as nats.UserCredentials does: credentials
// rewritten in place are the ones a connection presents once the server
// comes back.
func TestRead_ReconnectReadsTheFileAgain(t *testing.T) {
	t.Parallel()
	setup, err := auth.Init(t.TempDir(), "")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"alice", "bob"} {
		if err := setup.Add(auth.Grant{Principal: p, Role: auth.RoleProducer, Actors: []string{"user:" + p}, Capabilities: []string{"*"}}); err != nil {
			t.Fatal(err)
		}
	}
	env := testenv.Start(t, testenv.Auth(setup))
	userKey := func(principal string) string {
		cr, err := credfile.Read(setup.CredsPath(principal))
		if err != nil {
			t.Fatal(err)
		}
		uc, err := jwt.DecodeUserClaims(cr.JWT)
		if err != nil {
			t.Fatal(err)
		}
		return uc.Subject
	}
	presented := func() string {
		cz, err := env.Server.Connz(&server.ConnzOptions{Username: true})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range cz.Conns {
			if c.Name == t.Name() {
				return c.AuthorizedUser
			}
		}
		return ""
	}
	path := filepath.Join(t.TempDir(), "rotated.creds")
	copyCreds := func(principal string) {
		b, err := os.ReadFile(setup.CredsPath(principal))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	copyCreds("alice")
	cr, err := credfile.Read(path)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := broker.Connect(broker.ConnectOptions{URL: env.URL, Creds: path, Credentials: cr.Credentials, Name: t.Name()})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if got, want := presented(), userKey("alice"); got != want {
		t.Fatalf("connected as user %q, want alice's %q", got, want)
	}
	copyCreds("bob")
	env.Restart(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for presented() != userKey("bob") {
		select {
		case <-ctx.Done():
			t.Fatalf("after the restart the connection presents %q, not the rewritten file's (bob's)", presented())
		case <-time.After(50 * time.Millisecond):
		}
	}
}
