package main

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// Every command prints for a person by default and its JSON with -o json:
// call shows the status and the output indented; describe says which
// capability may ask for an approval.
func TestOutput_ForAPersonByDefault_JSONOnRequest(t *testing.T) {
	t.Parallel()
	_, url := startDev(t)
	stdout, stderr, code := capstan(t, url, "call", "demo.echo", "--input", `{"hello":{"to":"world"}}`)
	if code != exitOK {
		t.Fatalf("call: exit %d: %s", code, stderr)
	}
	for _, want := range []string{"Execution", "Status", "completed", "Output", "  \"hello\": {\n    \"to\": \"world\""} {
		if !strings.Contains(stdout, want) {
			t.Errorf("call's summary lacks %q:\n%s", want, stdout)
		}
	}
	stdout, _, code = capstan(t, url, "call", "demo.echo", "-o", "json", "--input", `{"a":1}`)
	if env := decode[printedEnvelope](t, stdout); code != exitOK || env.Status != "completed" {
		t.Fatalf("call -o json: exit %d %+v", code, env)
	}
	stdout, _, code = capstan(t, url, "call", "orders.refund", "--input", `{"orderId":"o-1","amount":900}`)
	if code != exitApproval || !strings.Contains(stdout, "approval-required") || !strings.Contains(stdout, "capstan resume ") {
		t.Fatalf("an approval-required call: exit %d:\n%s", code, stdout)
	}
	stdout, _, code = capstan(t, url, "submit", "demo.echo")
	id := strings.TrimSpace(stdout)
	if code != exitOK || len(id) != 36 {
		t.Fatalf("submit prints the id alone: exit %d %q", code, stdout)
	}
	stdout, _, _ = capstan(t, url, "submit", "demo.echo", "-o", "json")
	if v := decode[struct{ ExecutionID string }](t, stdout); len(v.ExecutionID) != 36 {
		t.Fatalf("submit -o json: %s", stdout)
	}
	stdout, _, code = capstan(t, url, "describe")
	if code != exitOK || !strings.Contains(stdout, "may (refund-approval-above-500)") {
		t.Fatalf("describe does not say orders.refund may ask for an approval:\n%s", stdout)
	}
}

// capstan executions lists newest first, filters, pages with a cursor it
// prints, and -o json is the page; a unique id prefix is taken for the id,
// an ambiguous one lists the candidates.
func TestExecutions_ListFilterPageAndPrefixes(t *testing.T) {
	t.Parallel()
	_, url := startDev(t)
	var ids []string
	for i := range 3 {
		stdout, stderr, code := capstan(t, url, "call", "-o", "json", "demo.echo", "--input", fmt.Sprintf(`{"n":%d}`, i))
		if code != exitOK {
			t.Fatalf("call: %s", stderr)
		}
		ids = append(ids, decode[printedEnvelope](t, stdout).ExecutionID)
	}
	if _, _, code := capstan(t, url, "call", "demo.flaky", "--input", `{"failTimes":5}`); code != exitFailed {
		t.Fatalf("flaky: exit %d", code)
	}
	var page struct {
		Entries []struct {
			ExecutionID, Status, CapabilityID string
		}
		Next string
	}
	waitFor := func(args ...string) {
		t.Helper()
		for ctx := mcpCtx(t); ; {
			stdout, stderr, code := capstan(t, url, append([]string{"executions", "-o", "json"}, args...)...)
			if code != exitOK {
				t.Fatalf("executions %v: exit %d: %s", args, code, stderr)
			}
			page.Entries, page.Next = nil, ""
			if err := json.Unmarshal([]byte(stdout), &page); err != nil {
				t.Fatal(err)
			}
			if len(page.Entries) > 0 && (len(args) > 0 || len(page.Entries) >= 4) {
				return
			}
			select {
			case <-ctx.Done():
				t.Fatalf("executions %v: %s", args, stdout)
			default:
			}
		}
	}
	waitFor()
	if got := page.Entries[1].ExecutionID; got != ids[2] {
		t.Fatalf("newest first: the second is %s, want the last echo %s (%+v)", got, ids[2], page.Entries)
	}
	waitFor("--status", "failed")
	if len(page.Entries) != 1 || page.Entries[0].CapabilityID != "demo.flaky" {
		t.Fatalf("--status failed: %+v", page.Entries)
	}
	waitFor("--capability", "demo.echo", "--limit", "2")
	if len(page.Entries) != 2 || page.Next == "" {
		t.Fatalf("--limit 2: %+v next %q", page.Entries, page.Next)
	}
	stdout, _, _ := capstan(t, url, "executions", "--capability", "demo.echo", "--limit", "2")
	if !strings.Contains(stdout, "capstan executions --capability demo.echo --limit 2 --cursor "+page.Next) {
		t.Fatalf("the table does not print the next page's command:\n%s", stdout)
	}
	waitFor("--capability", "demo.echo", "--limit", "2", "--cursor", page.Next)
	if len(page.Entries) != 1 || page.Entries[0].ExecutionID != ids[0] {
		t.Fatalf("the second page: %+v, want %s", page.Entries, ids[0])
	}

	// The first 13 characters (what the console shows in a title) name one.
	stdout, stderr, code := capstan(t, url, "status", ids[0][:13], "-o", "json")
	if code != exitOK || !strings.Contains(stdout, ids[0]) {
		// Two executions of one millisecond share 13 characters: the
		// error lists both.
		if !strings.Contains(stderr, "ambiguous") || !strings.Contains(stderr, ids[0]) {
			t.Fatalf("status of a prefix: exit %d, %s%s", code, stdout, stderr)
		}
	}
	// The characters the first two ids share, when there are enough of
	// them to be taken as a prefix (ids made over a minute apart share
	// fewer).
	common := 0
	for common < len(ids[0]) && ids[0][common] == ids[1][common] {
		common++
	}
	if common >= 8 {
		_, stderr, code = capstan(t, url, "audit", ids[0][:common])
		if code != exitUsage || !strings.Contains(stderr, "ambiguous") || !strings.Contains(stderr, ids[0]) || !strings.Contains(stderr, ids[1]) {
			t.Fatalf("an ambiguous prefix %q: exit %d: %s", ids[0][:common], code, stderr)
		}
	}
}

// What the CLI tried and what to do: nothing listening, a web address, the
// console's port.
func TestConnectionErrors_SayWhatWasTriedAndWhatToDo(t *testing.T) {
	t.Parallel()
	port := freePort(t)
	_, stderr, code := capstan(t, fmt.Sprintf("nats://127.0.0.1:%d", port), "status", "x1234567")
	if code != exitUsage || !strings.Contains(stderr, "No NATS server answers") || !strings.Contains(stderr, "capstan dev") ||
		!strings.Contains(stderr, "CAPSTAN_NATS_URL") {
		t.Fatalf("nothing listening: exit %d: %s", code, stderr)
	}
	_, stderr, code = capstan(t, "http://127.0.0.1:8233", "status", "x1234567")
	if code != exitUsage || !strings.Contains(stderr, "web address, not a NATS server's") {
		t.Fatalf("an http URL: exit %d: %s", code, stderr)
	}
	// An HTTP server where NATS was expected: named as such, at once.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.NotFoundHandler()}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	_, stderr, code = capstan(t, "nats://"+l.Addr().String(), "status", "x1234567")
	if code != exitUsage || !strings.Contains(stderr, "speaks HTTP, not NATS") {
		t.Fatalf("an HTTP port: exit %d: %s", code, stderr)
	}
}

// With authentication every refusal is immediate and names the role and the
// right; an approver reads the execution behind its approval through the
// workers, and nothing else.
func TestRoles_RefusalsNameTheRoleAndTheRight(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "secrets")
	for _, args := range [][]string{
		{"auth", "init", dir},
		{"auth", "add", dir, "alice", "--role", "producer", "--actor", "user:alice", "--capabilities", "*"},
		{"auth", "add", dir, "carol", "--role", "approver", "--actor", "user:carol", "--types", "finance"},
	} {
		if _, stderr, code := capstan(t, "", args...); code != exitOK {
			t.Fatalf("%v: exit %d: %s", args, code, stderr)
		}
	}
	port := freePort(t)
	startDaemon(t, "capstan call demo.echo", nil, "dev", "--auth", dir, "--store", t.TempDir(),
		"--listen", fmt.Sprintf("127.0.0.1:%d", port), "--grace", "5s", "--console", "off")
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	alice, carol := "--creds="+filepath.Join(dir, "alice.creds"), "--creds="+filepath.Join(dir, "carol.creds")

	stdout, _, _ := capstan(t, url, "call", "-o", "json", "orders.refund", alice, "--input", `{"orderId":"o-9","amount":900}`)
	refund := decode[printedEnvelope](t, stdout).ExecutionID
	stdout, _, _ = capstan(t, url, "call", "-o", "json", "demo.echo", alice, "--input", `{"private":true}`)
	echo := decode[printedEnvelope](t, stdout).ExecutionID

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"await", echo, carol}, `approver "carol" may not await results`},
		{[]string{"cancel", echo, carol}, `approver "carol" may not cancel executions`},
		{[]string{"describe", carol}, `approver "carol" may not describe capabilities`},
		{[]string{"audit", "--follow", alice}, `producer "alice" may not follow the audit stream`},
		{[]string{"approvals", "approve", refund, alice}, `producer "alice" may not decide approvals`},
	} {
		_, stderr, code := capstan(t, url, tc.args...)
		if code != exitUsage || !strings.Contains(stderr, tc.want) {
			t.Errorf("%v: exit %d: %s; want %q", tc.args, code, stderr, tc.want)
		}
	}
	// carol reads the refund behind her approval — its trail and outcome —
	// and lists it; the echo is not hers to read.
	stdout, stderr, code := capstan(t, url, "audit", refund, carol)
	if code != exitOK || !strings.Contains(stdout, "capability.approval_requested") {
		t.Fatalf("carol's audit of the refund: exit %d: %s%s", code, stdout, stderr)
	}
	stdout, _, code = capstan(t, url, "status", refund, carol)
	if code != exitOK || !strings.Contains(stdout, "approval-required") {
		t.Fatalf("carol's status of the refund: exit %d: %s", code, stdout)
	}
	stdout, _, _ = capstan(t, url, "executions", carol, "-o", "json")
	if !strings.Contains(stdout, refund) || strings.Contains(stdout, echo) {
		t.Fatalf("carol's listing: %s", stdout)
	}
	if _, stderr, code := capstan(t, url, "audit", echo, carol); code != exitUsage || !strings.Contains(stderr, "approver (carol) reads only the executions behind approvals") {
		t.Fatalf("carol's audit of the echo: exit %d: %s", code, stderr)
	}
	// alice reads her own trail through the workers.
	stdout, _, code = capstan(t, url, "audit", echo, alice)
	if code != exitOK || !strings.Contains(stdout, "capability.completed") {
		t.Fatalf("alice's audit of her echo: exit %d: %s", code, stdout)
	}
}

// capstan mcp --print-config prints a host's configuration with this
// binary's absolute path and every file absolute.
func TestMCP_PrintConfigHasAbsolutePaths(t *testing.T) {
	t.Parallel()
	stdout, stderr, code := capstan(t, "nats://127.0.0.1:4999", "mcp", "--print-config", "--actor", "user:ada", "--creds", "secrets/ada.creds")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var cfg struct {
		MCPServers map[string]struct {
			Command string
			Args    []string
		} `json:"mcpServers"`
	}
	if err := json.Unmarshal([]byte(stdout), &cfg); err != nil {
		t.Fatalf("%v:\n%s", err, stdout)
	}
	srv := cfg.MCPServers["capstan"]
	if !filepath.IsAbs(srv.Command) {
		t.Errorf("command %q is not absolute", srv.Command)
	}
	joined := strings.Join(srv.Args, " ")
	if !strings.Contains(joined, "--creds "+filepath.Join(mustAbs(t, "secrets/ada.creds"))) ||
		!strings.Contains(joined, "--actor user:ada") || !strings.Contains(joined, "--nats nats://127.0.0.1:4999") ||
		strings.Contains(joined, "print-config") {
		t.Errorf("args %v", srv.Args)
	}
}

// A switch before --print-config (--insecure) takes no value: the printed
// command serves, it does not print a configuration again.
func TestMCP_PrintConfigKeepsSwitchesAsSwitches(t *testing.T) {
	t.Parallel()
	stdout, stderr, code := capstan(t, "nats://127.0.0.1:4999", "mcp", "--insecure", "--print-config")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var cfg struct {
		MCPServers map[string]struct{ Args []string } `json:"mcpServers"`
	}
	if err := json.Unmarshal([]byte(stdout), &cfg); err != nil {
		t.Fatalf("%v:\n%s", err, stdout)
	}
	args := cfg.MCPServers["capstan"].Args
	if !slices.Contains(args, "--insecure") || slices.Contains(args, "--print-config") {
		t.Errorf("args %v", args)
	}
	// A switch turned off stays off.
	stdout, stderr, code = capstan(t, "nats://127.0.0.1:4999", "mcp", "--stateless=false", "--print-config")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if err := json.Unmarshal([]byte(stdout), &cfg); err != nil {
		t.Fatalf("%v:\n%s", err, stdout)
	}
	args = cfg.MCPServers["capstan"].Args
	if slices.Contains(args, "--stateless") || !slices.Contains(args, "--stateless=false") {
		t.Errorf("--stateless=false printed as %v", args)
	}
}

func mustAbs(t *testing.T, p string) string {
	t.Helper()
	a, err := filepath.Abs(p)
	if err != nil {
		t.Fatal(err)
	}
	return a
}
