package main

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/demo"
	"github.com/capstan-dev/capstan/internal/policies"
)

// Cedar policies with the command, against a running `capstan dev`:
// `policy test` lists exactly the recorded executions whose decision a set
// would change, and the cases of a file that it decides otherwise than
// they expect; `policy apply` puts the set in force on the running worker,
// no restart; a set that does not validate is refused, and the one in
// force stays.
func TestPolicyProcesses_TestThenApplyLiveThenRefuseABrokenSet(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("processes")
	}
	_, url := startDev(t)
	nc := connect(t, url)
	client := func(actor string) *executor.Client {
		kind, id, _ := strings.Cut(actor, ":")
		c, err := executor.NewClient(nc, executor.ClientConfig{Actor: envelope.Actor{Kind: kind, ID: id}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	alice, bob := client("user:alice"), client("user:bob")
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	mail := demo.EmailInput{To: "x@example.com", Subject: "hi"}
	call := func(c *executor.Client, capID string, in any) *envelope.Envelope {
		t.Helper()
		env, err := c.Call(ctx, capID, in)
		if err != nil {
			t.Fatal(err)
		}
		return env
	}
	var bobsMail []string
	for range 2 {
		call(alice, "email.send", mail)
		call(alice, "demo.echo", map[string]int{"n": 1})
		bobsMail = append(bobsMail, call(bob, "email.send", mail).ExecutionID)
	}
	call(bob, "demo.echo", map[string]int{"n": 2})

	dir := t.TempDir()
	set := filepath.Join(dir, "rules.cedar")
	write(t, set, `@id("everyone")
permit (principal, action in Action::"call", resource);

@id("bob-sends-no-mail")
forbid (principal == User::"bob", action == Action::"email.send", resource);

@id("no-mail-to-competitors")
forbid (principal, action == Action::"email.send", resource)
when { context.input.to like "*@competitor.example" };
`)
	cases := filepath.Join(dir, "cases.json")
	write(t, cases, `[
  {"name": "alice mails a competitor", "principal": "_anon", "actor": "user:alice", "capability": "email.send",
   "input": {"to": "ceo@competitor.example", "subject": "hi"}, "expect": "deny"},
  {"name": "alice mails a friend", "principal": "_anon", "actor": "user:alice", "capability": "email.send",
   "input": {"to": "bff@example.com", "subject": "hi"}, "expect": "allow"}
]`)
	// The index is written with the trail, asynchronously: wait until it
	// holds the seven executions.
	var r policyTest
	for {
		out, stderr, code := capstan(t, url, "policy", "test", set, "--cases", cases, "-o", "json")
		if code != 0 {
			t.Fatalf("policy test: exit %d\n%s%s", code, out, stderr)
		}
		r = decode[policyTest](t, out)
		if len(r.Recorded) >= 7 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the trail recorded %d executions, want 7", len(r.Recorded))
		case <-time.After(100 * time.Millisecond):
		}
	}
	var changed []string
	for _, o := range r.Recorded {
		if o.Changed {
			changed = append(changed, o.Case.ExecutionID)
			if o.Now.Word() != "allow" || o.With.Word() != "deny" || !strings.HasPrefix(o.With.Policy, "bob-sends-no-mail") {
				t.Errorf("changed decision: %+v", o)
			}
		}
	}
	slices.Sort(changed)
	slices.Sort(bobsMail)
	if !slices.Equal(changed, bobsMail) {
		t.Fatalf("decisions that change: %v, want bob's mails %v (of %+v)", changed, bobsMail, r.Recorded)
	}
	// Mails whose address the trail does not keep: decided only by cases.
	if r.Failed != 0 || len(r.Cases) != 2 || r.Cases[0].With.Word() != "deny" || r.Cases[1].With.Word() != "allow" {
		t.Fatalf("cases: %+v", r.Cases)
	}
	write(t, cases, `[{"name": "bob mails", "principal": "_anon", "actor": "user:bob", "capability": "email.send",
  "input": {"to": "a@example.com", "subject": "hi"}, "expect": "allow"}]`)
	if out, _, code := capstan(t, url, "policy", "test", set, "--cases", cases, "--limit", "0"); code != 1 || !strings.Contains(out, "expected allow") {
		t.Fatalf("a case decided otherwise than it expects: exit %d\n%s", code, out)
	}

	// Applied to the running worker.
	out, stderr, code := capstan(t, url, "policy", "apply", set, "--reason", "bob's mail loop", "-o", "json")
	if code != 0 {
		t.Fatalf("policy apply: exit %d\n%s%s", code, out, stderr)
	}
	a := decode[policyAnswer](t, out)
	if a.Current.Version != 1 || len(a.Workers) != 1 || a.Workers[0].PolicyVersion != 1 {
		t.Fatalf("apply: %+v", a)
	}
	if env := call(bob, "email.send", mail); env.Error == nil || env.Error.Code != envelope.CodePolicyDenied {
		t.Fatalf("bob's mail under v1: %+v", env)
	}
	if env := call(alice, "email.send", mail); env.Status != envelope.StatusCompleted {
		t.Fatalf("alice's mail under v1: %+v", env)
	}

	// A set that does not validate is refused; v1 stays and decides.
	broken := filepath.Join(dir, "broken.cedar")
	write(t, broken, `permit (principal, action, resource) when { context.input.bcc == "all" };`)
	if out, stderr, code := capstan(t, url, "policy", "apply", broken, "--reason", "typo"); code != 1 || !strings.Contains(stderr, "does not validate") {
		t.Fatalf("a broken set: exit %d\n%s%s", code, out, stderr)
	}
	out, _, _ = capstan(t, url, "policy", "show", "-o", "json")
	if v := decode[policies.Version](t, out); v.Version != 1 {
		t.Fatalf("in force after a refused apply: v%d", v.Version)
	}
	if env := call(bob, "email.send", mail); env.Error == nil || env.Error.Code != envelope.CodePolicyDenied {
		t.Fatalf("bob's mail after the refused apply: %+v", env)
	}
}

func write(t *testing.T, path, text string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
}
