package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

func TestAuth_InitAddListWriteCredentialsAndGrants(t *testing.T) {
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
	stdout, stderr, code := capstan(t, "", "auth", "list", dir)
	if code != exitOK {
		t.Fatalf("list: exit %d: %s", code, stderr)
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
	_, stderr, code := capstan(t, "", "server", "--store", t.TempDir(), "--listen", fmt.Sprintf("0.0.0.0:%d", freePort(t)))
	if code != exitUsage || !strings.Contains(stderr, "--auth") || !strings.Contains(stderr, "--insecure") {
		t.Fatalf("exit %d, stderr %s", code, stderr)
	}
	_, stderr, code = capstan(t, "", "dev", "--store", t.TempDir(), "--listen", fmt.Sprintf("0.0.0.0:%d", freePort(t)))
	if code != exitUsage || !strings.Contains(stderr, "--auth") {
		t.Fatalf("dev: exit %d, stderr %s", code, stderr)
	}
}
