package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

// Over its queue quota a producer is refused at the door, from the command
// line: call prints a failed QUOTA_EXCEEDED envelope naming the quota and
// its limit (never stored), submit exits failed saying the same; auth set
// and auth push raise the quota on the running deployment, and the next call
// is taken.
func TestDevWithAuth_OverItsQueueQuotaRefusedAtTheDoor(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "secrets")
	for _, args := range [][]string{
		{"auth", "init", dir},
		{"auth", "add", dir, "alice", "--role", "producer", "--actor", "user:alice", "--capabilities", "demo.*,email.send", "--quota-queued", "2"},
	} {
		if _, stderr, code := capstan(t, "", args...); code != exitOK {
			t.Fatalf("%v: exit %d: %s", args, code, stderr)
		}
	}
	port := freePort(t)
	startDaemon(t, "capstan call demo.echo", nil, "dev", "--auth", dir, "--store", t.TempDir(),
		"--listen", fmt.Sprintf("127.0.0.1:%d", port), "--grace", "1s")
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	alice := "--creds=" + filepath.Join(dir, "alice.creds")

	// Two held sends fill alice's queue.
	for i := range 2 {
		input := fmt.Sprintf(`{"to":"q%d@example.com","subject":"held","holdMs":60000}`, i)
		if _, stderr, code := capstan(t, url, "submit", "email.send", alice, "--input", input); code != exitOK {
			t.Fatalf("held send %d: exit %d: %s", i, code, stderr)
		}
	}
	stdout, stderr, code := capstan(t, url, "call", "-o", "json", "demo.echo", alice, "--input", `{"over":true}`)
	env := decode[struct {
		Status string `json:"status"`
		Error  *struct {
			Code    string         `json:"code"`
			Details map[string]any `json:"details"`
		} `json:"error"`
	}](t, stdout)
	if code != exitFailed || env.Status != "failed" || env.Error == nil || env.Error.Code != "QUOTA_EXCEEDED" ||
		env.Error.Details["quota"] != "queuedRequests" || fmt.Sprint(env.Error.Details["limit"]) != "2" {
		t.Fatalf("call over the quota: exit %d %+v: %s", code, env, stderr)
	}
	if _, stderr, code := capstan(t, url, "submit", "demo.echo", alice, "--input", `{"over":true}`); code != exitFailed ||
		!strings.Contains(stderr, "QUOTA_EXCEEDED") || !strings.Contains(stderr, "at most 2 requests") {
		t.Fatalf("submit over the quota: exit %d: %s", code, stderr)
	}

	for _, args := range [][]string{{"auth", "set", dir, "alice", "--quota-queued", "5"}, {"auth", "push", dir, "--nats", url}} {
		if _, stderr, code := capstan(t, "", args...); code != exitOK {
			t.Fatalf("%v: exit %d: %s", args, code, stderr)
		}
	}
	if stdout, stderr, code := capstan(t, url, "call", "-o", "json", "demo.echo", alice, "--input", `{"within":true}`); code != exitOK {
		t.Fatalf("call within the raised quota: exit %d: %s %s", code, stdout, stderr)
	}
}
