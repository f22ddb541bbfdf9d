package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/execution"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"

	"github.com/capstan-dev/capstan/auth"
	"github.com/capstan-dev/capstan/internal/testenv"
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
		{"gateway", "--role", "producer", "--actor", "user:*", "--capabilities", "*"},
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
		// No capability is granted by default: the flag is required, and
		// says why.
		{[]string{"mallory", "--role", "producer", "--actor", "user:mallory"}, "a producer needs --capabilities"},
		{[]string{"mallory", "--role", "producer", "--actor", "user:mallory", "--capabilities", ""}, "none is granted by default"},
		{[]string{"mallory", "--role", "approver", "--types", "finance", "--capabilities", "*"}, "--capabilities is a producer's"},
		{[]string{"mallory", "--role", "approver"}, "--types"},
		{[]string{"Mallory!", "--role", "admin"}, "principal"},
		{[]string{"alice", "--role", "admin"}, "already exists"},
	} {
		if _, stderr, code := capstan(t, "", append([]string{"auth", "add", dir}, tc.args...)...); code != exitUsage || !strings.Contains(stderr, tc.want) {
			t.Fatalf("add %v: exit %d, stderr %q, want exit 2 naming %q", tc.args, code, stderr, tc.want)
		}
	}
	if _, stderr, code := capstan(t, "", "auth", "add", dir, "temp", "--role", "producer", "--actor", "user:temp", "--capabilities", "demo.echo"); code != exitOK {
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

// The secured setup from zero, as docs/security.md shows it: two principals, one
// asks, the other approves; neither can do the other's part.
func TestDevWithAuth_SecuredFromZeroWithTwoPrincipals(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "secrets")
	for _, args := range [][]string{
		{"auth", "init", dir},
		{"auth", "add", dir, "alice", "--role", "producer", "--actor", "user:alice", "--capabilities", "demo.*,orders.refund"},
		{"auth", "add", dir, "carol", "--role", "approver", "--actor", "user:carol", "--types", "finance"},
		{"auth", "add", dir, "gateway", "--role", "producer", "--actor", "user:*", "--capabilities", "orders.refund"},
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

	if _, stderr, code := capstan(t, url, "call", "-o", "json", "demo.echo", "--input", `{"hi":1}`); code != exitUsage {
		t.Fatalf("without credentials: exit %d: %s", code, stderr)
	}
	stdout, stderr, code := capstan(t, url, "call", "-o", "json", "demo.echo", alice, "--input", `{"hi":1}`)
	called := decode[printedEnvelope](t, stdout)
	if code != exitOK || called.Status != "completed" {
		t.Fatalf("alice's call: exit %d %+v: %s", code, called, stderr)
	}
	// A producer awaits and reads its own executions by key, without the
	// buckets' stream information, which it may not ask for.
	stdout, stderr, code = capstan(t, url, "await", "-o", "json", called.ExecutionID, alice)
	if env := decode[printedEnvelope](t, stdout); code != exitOK || env.ExecutionID != called.ExecutionID || env.Status != "completed" {
		t.Fatalf("alice's await: exit %d %+v: %s", code, env, stderr)
	}
	stdout, stderr, code = capstan(t, url, "status", called.ExecutionID, alice, "--json")
	status := decode[struct {
		Record   execution.Record `json:"record"`
		Envelope printedEnvelope  `json:"envelope"`
	}](t, stdout)
	if code != exitOK || status.Record.ExecutionID != called.ExecutionID || status.Record.Actor != "user:alice" || status.Envelope.Status != "completed" {
		t.Fatalf("alice's status: exit %d %+v: %s", code, status, stderr)
	}
	stdout, _, code = capstan(t, url, "call", "-o", "json", "demo.echo", alice, "--actor", "user:bob", "--input", `{"hi":1}`)
	if env := decode[printedEnvelope](t, stdout); code != exitFailed || env.Error == nil || env.Error.Code != "FORBIDDEN" {
		t.Fatalf("alice as bob: exit %d %+v", code, env)
	}

	stdout, stderr, code = capstan(t, url, "call", "-o", "json", "orders.refund", alice, "--input", `{"orderId":"o1","amount":900}`)
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
		!strings.Contains(stderr, `producer "alice" may not decide approvals: its credentials do not allow publishing to capstan.approvals.decide.alice`) {
		t.Fatalf("alice approved her own refund: exit %d: %s", code, stderr)
	}
	if _, stderr, code := capstan(t, url, "approvals", "approve", approval, alice, "--approver", "user:ceo"); code != exitUsage {
		t.Fatalf("--approver with credentials: exit %d: %s", code, stderr)
	}
	// carol decides no call made as her, not even one another principal (a
	// gateway) made: another approver's credentials are the way out.
	gateway := "--creds=" + filepath.Join(dir, "gateway.creds")
	stdout, stderr, code = capstan(t, url, "call", "-o", "json", "orders.refund", gateway, "--actor", "user:carol", "--input", `{"orderId":"o2","amount":900}`)
	if code != exitApproval {
		t.Fatalf("the gateway's refund as carol: exit %d: %s %s", code, stdout, stderr)
	}
	own := decode[struct {
		Approval struct {
			ID string `json:"id"`
		} `json:"approval"`
	}](t, stdout).Approval.ID
	if _, stderr, code := capstan(t, url, "approvals", "approve", own, carol); code != exitFailed || !strings.Contains(stderr, "APPROVAL_SELF_APPROVAL") ||
		!strings.Contains(stderr, "an approver with other credentials decides it: 'capstan approvals approve "+own+" --creds APPROVER.creds'") {
		t.Fatalf("carol approved a call made as her: exit %d: %s", code, stderr)
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
	if _, stderr, code := capstan(t, url, "resume", "-o", "json", approval, carol); code != exitUsage || !strings.Contains(stderr, `approver "carol" may not resume approved calls`) {
		t.Fatalf("carol resumed alice's call: exit %d: %s", code, stderr)
	}
	stdout, stderr, code = capstan(t, url, "resume", "-o", "json", approval, alice)
	if env := decode[printedEnvelope](t, stdout); code != exitOK || env.Status != "completed" {
		t.Fatalf("resume: exit %d %+v: %s", code, env, stderr)
	}
	stdout, _, code = capstan(t, url, "resume", "-o", "json", approval, alice)
	if env := decode[printedEnvelope](t, stdout); code != exitFailed || env.Error == nil || env.Error.Code != "APPROVAL_CONSUMED" {
		t.Fatalf("second resume: exit %d %+v", code, env)
	}
}

// A one-account setup is refused until migrated; the migration says loudly
// which credentials are new, does nothing the second time, and the
// migrated setup serves its principals.
func TestAuthMigrate_OneAccountSetupThenServes(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "secrets")
	testenv.LegacySetup(t, dir, auth.Grant{Principal: "alice", Role: auth.RoleProducer, Actors: []string{"user:alice"}, Capabilities: []string{"demo.*"}})
	for _, args := range [][]string{
		{"server", "--auth", dir, "--store", t.TempDir(), "--listen", fmt.Sprintf("127.0.0.1:%d", freePort(t))},
		{"auth", "add", dir, "bob", "--role", "producer", "--actor", "user:bob", "--capabilities", "*"},
		{"auth", "push", dir},
	} {
		if _, stderr, code := capstan(t, "", args...); code == exitOK || !strings.Contains(stderr, "capstan auth migrate "+dir) {
			t.Fatalf("%v on a one-account setup: exit %d: %s", args, code, stderr)
		}
	}
	stdout, stderr, code := capstan(t, "", "auth", "migrate", dir)
	if code != exitOK || !strings.Contains(stdout, "NEW CREDENTIALS") || !strings.Contains(stdout, filepath.Join(dir, "alice.creds")) ||
		strings.Contains(stdout, filepath.Join(dir, "worker.creds")) {
		t.Fatalf("migrate: exit %d:\n%s\n%s", code, stdout, stderr)
	}
	if stdout, _, code := capstan(t, "", "auth", "migrate", dir); code != exitOK || !strings.Contains(stdout, "nothing to migrate") {
		t.Fatalf("second migrate: exit %d: %s", code, stdout)
	}
	port := freePort(t)
	startDaemon(t, "capstan call demo.echo", nil, "dev", "--auth", dir, "--store", t.TempDir(),
		"--listen", fmt.Sprintf("127.0.0.1:%d", port), "--grace", "5s")
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	stdout, stderr, code = capstan(t, url, "call", "-o", "json", "demo.echo", "--creds", filepath.Join(dir, "alice.creds"), "--input", `{"hi":1}`)
	if env := decode[printedEnvelope](t, stdout); code != exitOK || env.Status != "completed" {
		t.Fatalf("alice after the migration: exit %d %+v: %s", code, env, stderr)
	}
}

// Limits set at auth add are signed into the principal's account and
// shown by auth list; they are refused where they mean nothing.
func TestAuthAdd_Limits(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "secrets")
	if _, stderr, code := capstan(t, "", "auth", "init", dir); code != exitOK {
		t.Fatalf("init: %s", stderr)
	}
	if _, stderr, code := capstan(t, "", "auth", "add", dir, "alice", "--role", "producer", "--actor", "user:alice", "--capabilities", "*",
		"--max-connections", "3", "--max-subscriptions", "40", "--max-payload", "64KiB"); code != exitOK {
		t.Fatalf("add: %s", stderr)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"w2", "--role", "worker", "--max-connections", "3"}, "capstan account"},
		{[]string{"x", "--role", "producer", "--actor", "user:x", "--max-payload", "lots"}, "size"},
		{[]string{"x", "--role", "producer", "--actor", "user:x", "--max-connections", "0"}, "connections"},
		{[]string{"push", "--role", "producer", "--actor", "user:x", "--capabilities", "*"}, "setup's own"},
	} {
		if _, stderr, code := capstan(t, "", append([]string{"auth", "add", dir}, tc.args...)...); code != exitUsage || !strings.Contains(stderr, tc.want) {
			t.Fatalf("add %v: exit %d: %s", tc.args, code, stderr)
		}
	}
	stdout, _, _ := capstan(t, "", "auth", "list", dir)
	if !strings.Contains(stdout, "conns=3,subs=40,payload=64KiB") {
		t.Fatalf("list:\n%s", stdout)
	}
	s, err := auth.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	g, _ := s.Grant("alice")
	ac, err := jwt.DecodeAccountClaims(g.AccountJWT)
	if err != nil || ac.Limits.Conn != 3 || ac.Limits.Subs != 40 || ac.Limits.Payload != 64<<10 {
		t.Fatalf("alice's account: %v %+v", err, ac.Limits)
	}
}

// Credentials and seeds are secrets: a file others may read is refused,
// naming the mode to set, before anything connects or signs.
func TestCredentials_ReadableByOthersAreRefused(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "secrets")
	if _, stderr, code := capstan(t, "", "auth", "init", dir); code != exitOK {
		t.Fatalf("init: %s", stderr)
	}
	creds := filepath.Join(dir, "admin.creds")
	if err := os.Chmod(creds, 0o644); err != nil {
		t.Fatal(err)
	}
	_, stderr, code := capstan(t, "nats://127.0.0.1:1", "call", "demo.echo", "--creds", creds)
	if code != exitUsage || !strings.Contains(stderr, "chmod 600 "+creds) {
		t.Fatalf("loose credentials: exit %d: %s", code, stderr)
	}
	seed := filepath.Join(dir, "account.nk")
	if err := os.Chmod(seed, 0o640); err != nil {
		t.Fatal(err)
	}
	_, stderr, code = capstan(t, "", "auth", "add", dir, "alice", "--role", "producer", "--actor", "user:alice", "--capabilities", "*")
	if code != exitUsage || !strings.Contains(stderr, "chmod 600 "+seed) {
		t.Fatalf("a loose seed: exit %d: %s", code, stderr)
	}
}

// Three `capstan server --auth` processes make a cluster; a principal added
// and pushed with `capstan auth push` calls through every node at once, and
// removed and pushed again, is disconnected from every node and refused by
// each, with no restart.
func TestAuthPush_LivePrincipalsOnAClusterOfProcesses(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("3-node cluster")
	}
	dir := filepath.Join(t.TempDir(), "secrets")
	if _, stderr, code := capstan(t, "", "auth", "init", dir); code != exitOK {
		t.Fatalf("init: %s", stderr)
	}
	_, urls := startServerCluster(t, "--auth", dir)
	startDaemon(t, "", []string{"CAPSTAN_NATS_URL=" + urls}, "worker", "--creds", filepath.Join(dir, "worker.creds"))
	if _, stderr, code := capstan(t, urls, "auth", "add", dir, "erin", "--role", "producer", "--actor", "user:erin", "--capabilities", "*"); code != exitOK {
		t.Fatalf("add: %s", stderr)
	}
	creds := filepath.Join(dir, "erin.creds")
	nodes := strings.Split(urls, ",")
	if _, _, code := capstan(t, nodes[0], "call", "demo.echo", "--creds", creds, "--input", `{}`); code == exitOK {
		t.Fatal("erin called before her account was pushed")
	}
	if stdout, stderr, code := capstan(t, urls, "auth", "push", dir); code != exitOK || !strings.Contains(stdout, "to 3 servers") {
		t.Fatalf("push: exit %d: %s %s", code, stdout, stderr)
	}
	var conns []*nats.Conn
	closed := make(chan string, len(nodes))
	for _, url := range nodes {
		stdout, stderr, code := capstan(t, url, "call", "-o", "json", "demo.echo", "--creds", creds, "--input", `{"via":"`+url+`"}`)
		if env := decode[printedEnvelope](t, stdout); code != exitOK || env.Status != "completed" {
			t.Fatalf("erin through %s: exit %d %+v: %s", url, code, env, stderr)
		}
		nc, err := nats.Connect(url, nats.UserCredentials(creds), nats.NoReconnect(),
			nats.ClosedHandler(func(*nats.Conn) { closed <- url }))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		conns = append(conns, nc)
	}
	kept := filepath.Join(t.TempDir(), "erin.creds")
	if b, err := os.ReadFile(creds); err != nil || os.WriteFile(kept, b, 0o600) != nil {
		t.Fatal(err)
	}
	if _, stderr, code := capstan(t, urls, "auth", "remove", dir, "erin"); code != exitOK {
		t.Fatalf("remove: %s", stderr)
	}
	if _, stderr, code := capstan(t, urls, "auth", "push", dir); code != exitOK {
		t.Fatalf("push: %s", stderr)
	}
	deadline := time.After(guard)
	for range conns {
		select {
		case <-closed:
		case <-deadline:
			t.Fatal("erin's connections outlived the push of her removal")
		}
	}
	for _, url := range nodes {
		if nc, err := nats.Connect(url, nats.UserCredentials(kept), nats.NoReconnect()); err == nil {
			nc.Close()
			t.Fatalf("erin, removed, connected to %s", url)
		}
	}
}

// Quotas are set at auth add, changed by auth set (only what is named,
// the rest kept), shown by auth list, and refused where they mean nothing.
// Limits changed by auth set re-sign the account, keeping the credentials.
func TestAuthSet_QuotasAndLimits(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "secrets")
	if _, stderr, code := capstan(t, "", "auth", "init", dir); code != exitOK {
		t.Fatalf("init: %s", stderr)
	}
	if _, stderr, code := capstan(t, "", "auth", "add", dir, "alice", "--role", "producer", "--actor", "user:alice",
		"--capabilities", "*", "--quota-queued", "500"); code != exitOK {
		t.Fatalf("add: %s", stderr)
	}
	stdout, _, _ := capstan(t, "", "auth", "list", dir)
	if !strings.Contains(stdout, "queued=500,queued-bytes=64MiB,pending-approvals=200,control=50/s") {
		t.Fatalf("list after add:\n%s", stdout)
	}
	before, _ := auth.Load(dir)
	g0, _ := before.Grant("alice")
	stdout, stderr, code := capstan(t, "", "auth", "set", dir, "alice", "--quota-pending-approvals", "7", "--max-connections", "5")
	if code != exitOK || !strings.Contains(stdout, "pending-approvals=7") || !strings.Contains(stdout, "conns=5") {
		t.Fatalf("set: exit %d: %s %s", code, stdout, stderr)
	}
	s, err := auth.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	g, _ := s.Grant("alice")
	want := auth.Quotas{QueuedRequests: 500, QueuedBytes: 64 << 20, PendingApprovals: 7, ControlPerSecond: 50}
	if g.Quotas == nil || *g.Quotas != want {
		t.Fatalf("alice's quotas: %+v, want %+v", g.Quotas, want)
	}
	ac, err := jwt.DecodeAccountClaims(g.AccountJWT)
	if err != nil || ac.Limits.Conn != 5 || ac.Limits.Subs != auth.DefaultLimits.Subscriptions || ac.Subject != g0.Account {
		t.Fatalf("alice's account after set: %v %+v (subject %s, was %s)", err, ac.Limits, ac.Subject, g0.Account)
	}
	if g.PublicKey != g0.PublicKey {
		t.Fatalf("auth set issued a new user: %s, was %s", g.PublicKey, g0.PublicKey)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"alice"}, "name what to change"},
		{[]string{"nobody", "--quota-queued", "3"}, "no principal"},
		{[]string{"worker", "--quota-queued", "3"}, "capstan account"},
		{[]string{"alice", "--quota-queued", "0"}, "queuedRequests"},
	} {
		if _, stderr, code := capstan(t, "", append([]string{"auth", "set", dir}, tc.args...)...); code != exitUsage || !strings.Contains(stderr, tc.want) {
			t.Fatalf("set %v: exit %d: %s", tc.args, code, stderr)
		}
	}
	if _, stderr, code := capstan(t, "", "auth", "add", dir, "w2", "--role", "worker", "--quota-queued", "3"); code != exitUsage || !strings.Contains(stderr, "capstan account") {
		t.Fatalf("add a worker with a quota: exit %d: %s", code, stderr)
	}
}
