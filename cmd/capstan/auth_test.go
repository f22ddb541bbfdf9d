package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capstan-dev/capstan/executor"
)

func TestAuth_InitAddListWriteCredentialsAndGrants(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "secrets")
	if _, stderr, code := capstan(t, "", "auth", "init", dir); code != exitOK {
		t.Fatalf("init: exit %d: %s", code, stderr)
	}
	if _, stderr, code := capstan(t, "", "auth", "init", dir); code != exitFailed || !strings.Contains(stderr, "already exists") {
		t.Fatalf("second init: exit %d: %s", code, stderr)
	}
	for _, args := range [][]string{
		{"alice", "--role", "producer", "--actor", "user:alice", "--surfaces", "direct", "--capabilities", "demo.*,orders.refund"},
		{"gateway", "--role", "producer", "--actor", "user:*"},
		{"carol", "--role", "approver", "--actor", "user:carol", "--types", "finance"},
	} {
		if _, stderr, code := capstan(t, "", append([]string{"auth", "add", dir}, args...)...); code != exitOK {
			t.Fatalf("add %v: exit %d: %s", args, code, stderr)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"mallory", "--role", "root"}, "role"},
		{[]string{"mallory", "--role", "producer"}, "--actor"},
		{[]string{"mallory", "--role", "approver"}, "--types"},
		{[]string{"Mallory!", "--role", "admin"}, "principal"},
		{[]string{"alice", "--role", "admin"}, "already exists"},
	} {
		if _, stderr, code := capstan(t, "", append([]string{"auth", "add", dir}, tc.args...)...); code != exitUsage || !strings.Contains(stderr, tc.want) {
			t.Fatalf("add %v: exit %d, stderr %q, want exit 2 naming %q", tc.args, code, stderr, tc.want)
		}
	}
	if _, stderr, code := capstan(t, "", "auth", "add", dir, "temp", "--role", "producer", "--actor", "user:temp"); code != exitOK {
		t.Fatalf("add temp: exit %d: %s", code, stderr)
	}
	if _, stderr, code := capstan(t, "", "auth", "remove", dir, "temp"); code != exitOK {
		t.Fatalf("remove temp: exit %d: %s", code, stderr)
	}
	if _, stderr, code := capstan(t, "", "auth", "remove", dir, "worker"); code != exitUsage {
		t.Fatalf("remove worker: exit %d: %s", code, stderr)
	}
	stdout, stderr, code := capstan(t, "", "auth", "list", dir)
	if code != exitOK || strings.Contains(stdout, "temp") {
		t.Fatalf("list: exit %d: %s\n%s", code, stderr, stdout)
	}
	for _, want := range []string{
		"admin      admin", "worker     worker",
		"alice      producer  user:alice  direct    demo.*,orders.refund",
		"carol      approver  user:carol  -         -                     finance",
		"gateway    producer  user:*",
		filepath.Join(dir, "alice.creds"),
	} {
		if !strings.Contains(stdout, want) {
			t.Fatalf("list lacks %q:\n%s", want, stdout)
		}
	}
}

func TestServer_RefusesToListenBeyondLoopbackWithoutAuthentication(t *testing.T) {
	t.Parallel()
	_, stderr, code := capstan(t, "", "server", "--store", t.TempDir(), "--listen", fmt.Sprintf("0.0.0.0:%d", freePort(t)))
	if code != exitUsage || !strings.Contains(stderr, "--auth") || !strings.Contains(stderr, "--insecure") {
		t.Fatalf("exit %d, stderr %s", code, stderr)
	}
	_, stderr, code = capstan(t, "", "dev", "--store", t.TempDir(), "--listen", fmt.Sprintf("0.0.0.0:%d", freePort(t)))
	if code != exitUsage || !strings.Contains(stderr, "--auth") {
		t.Fatalf("dev: exit %d, stderr %s", code, stderr)
	}
}

// The secured setup from zero, as the README shows it: two principals, one
// asks, the other approves; neither can do the other's part.
func TestDevWithAuth_SecuredFromZeroWithTwoPrincipals(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "secrets")
	for _, args := range [][]string{
		{"auth", "init", dir},
		{"auth", "add", dir, "alice", "--role", "producer", "--actor", "user:alice", "--capabilities", "demo.*,orders.refund"},
		{"auth", "add", dir, "carol", "--role", "approver", "--actor", "user:carol", "--types", "finance"},
	} {
		if _, stderr, code := capstan(t, "", args...); code != exitOK {
			t.Fatalf("%v: exit %d: %s", args, code, stderr)
		}
	}
	port := freePort(t)
	startDaemon(t, "capstan call demo.echo", nil, "dev", "--auth", dir, "--store", t.TempDir(),
		"--listen", fmt.Sprintf("127.0.0.1:%d", port), "--grace", "5s")
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	alice, carol := "--creds="+filepath.Join(dir, "alice.creds"), "--creds="+filepath.Join(dir, "carol.creds")

	if _, stderr, code := capstan(t, url, "call", "demo.echo", "--input", `{"hi":1}`); code != exitUsage {
		t.Fatalf("without credentials: exit %d: %s", code, stderr)
	}
	stdout, stderr, code := capstan(t, url, "call", "demo.echo", alice, "--input", `{"hi":1}`)
	called := decode[printedEnvelope](t, stdout)
	if code != exitOK || called.Status != "completed" {
		t.Fatalf("alice's call: exit %d %+v: %s", code, called, stderr)
	}
	// A producer awaits and reads its own executions by key, without the
	// buckets' stream information, which it may not ask for.
	stdout, stderr, code = capstan(t, url, "await", called.ExecutionID, alice)
	if env := decode[printedEnvelope](t, stdout); code != exitOK || env.ExecutionID != called.ExecutionID || env.Status != "completed" {
		t.Fatalf("alice's await: exit %d %+v: %s", code, env, stderr)
	}
	stdout, stderr, code = capstan(t, url, "status", called.ExecutionID, alice, "--json")
	status := decode[struct {
		Record   executor.Record `json:"record"`
		Envelope printedEnvelope `json:"envelope"`
	}](t, stdout)
	if code != exitOK || status.Record.ExecutionID != called.ExecutionID || status.Record.Actor != "user:alice" || status.Envelope.Status != "completed" {
		t.Fatalf("alice's status: exit %d %+v: %s", code, status, stderr)
	}
	stdout, _, code = capstan(t, url, "call", "demo.echo", alice, "--actor", "user:bob", "--input", `{"hi":1}`)
	if env := decode[printedEnvelope](t, stdout); code != exitFailed || env.Error == nil || env.Error.Code != "FORBIDDEN" {
		t.Fatalf("alice as bob: exit %d %+v", code, env)
	}

	stdout, stderr, code = capstan(t, url, "call", "orders.refund", alice, "--input", `{"orderId":"o1","amount":900}`)
	if code != exitApproval {
		t.Fatalf("refund: exit %d: %s %s", code, stdout, stderr)
	}
	approval := decode[struct {
		Approval struct {
			ID string `json:"id"`
		} `json:"approval"`
	}](t, stdout).Approval.ID

	// alice cannot decide, whatever approver she names; carol can.
	if _, stderr, code := capstan(t, url, "approvals", "approve", approval, alice); code != exitUsage ||
		!strings.Contains(stderr, `producer "alice" may not publish to capstan.approvals.decide.alice`) {
		t.Fatalf("alice approved her own refund: exit %d: %s", code, stderr)
	}
	if _, stderr, code := capstan(t, url, "approvals", "approve", approval, alice, "--approver", "user:ceo"); code != exitUsage {
		t.Fatalf("--approver with credentials: exit %d: %s", code, stderr)
	}
	stdout, stderr, code = capstan(t, url, "approvals", "show", approval, carol, "--json")
	if rec := decode[struct{ Status string }](t, stdout); code != exitOK || rec.Status != "pending" {
		t.Fatalf("after alice's attempts: exit %d %+v: %s", code, rec, stderr)
	}
	stdout, stderr, code = capstan(t, url, "approvals", "approve", approval, carol, "--comment", "checked", "--json")
	rec := decode[struct {
		Status   string
		Decision struct {
			Approver struct{ Kind, ID string }
		}
	}](t, stdout)
	if code != exitOK || rec.Status != "approved" || rec.Decision.Approver.ID != "carol" {
		t.Fatalf("carol's approval: exit %d %+v: %s", code, rec, stderr)
	}
	if _, stderr, code := capstan(t, url, "resume", approval, carol); code != exitUsage || !strings.Contains(stderr, `approver "carol" may not publish`) {
		t.Fatalf("carol resumed alice's call: exit %d: %s", code, stderr)
	}
	stdout, stderr, code = capstan(t, url, "resume", approval, alice)
	if env := decode[printedEnvelope](t, stdout); code != exitOK || env.Status != "completed" {
		t.Fatalf("resume: exit %d %+v: %s", code, env, stderr)
	}
	stdout, _, code = capstan(t, url, "resume", approval, alice)
	if env := decode[printedEnvelope](t, stdout); code != exitFailed || env.Error == nil || env.Error.Code != "APPROVAL_CONSUMED" {
		t.Fatalf("second resume: exit %d %+v", code, env)
	}
}
