package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/execution"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden with the output of the human printers")

// goldenNow is the moment the golden outputs count ages from.
var goldenNow = time.Date(2026, 11, 30, 16, 0, 0, 0, time.UTC)

// golden compares got with testdata/name.golden, or rewrites it with -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./cmd/capstan -run Golden -update to write it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from its golden file\n--- got ---\n%s\n--- want ---\n%s", name, got, want)
	}
}

func sampleApprovals() []*approvals.Record {
	alice := envelope.Actor{Kind: "user", ID: "alice"}
	bob := envelope.Actor{Kind: "user", ID: "bob"}
	at := func(d time.Duration) time.Time { return goldenNow.Add(d) }
	return []*approvals.Record{
		{ID: "0197d2a0-0000-7000-8000-000000000001", CapabilityID: "orders.refund", Actor: alice, SideEffect: "write", Risk: "high",
			Input: json.RawMessage(`{"amount":900,"orderId":"o1"}`), InputHash: "5d41402abc4b2a76b9719d911017c592",
			Reasons: []string{"amount above 500"}, Types: []string{"finance"}, RequestedAt: at(-3 * time.Minute),
			ExpiresAt: at(12 * time.Minute), Status: approvals.StatusPending, RequestedBy: "0197d2a0-0000-7000-8000-0000000000a1"},
		{ID: "0197d2a0-0000-7000-8000-000000000002", CapabilityID: "orders.refund", Actor: alice, SideEffect: "write", Risk: "high",
			Input: json.RawMessage(`{"amount":700,"orderId":"o2"}`), Display: json.RawMessage(`{"amount":700}`),
			InputHash: "7d793037a0760186574b0282f2f435e7", Reasons: []string{"amount above 500", "new customer"},
			Types: []string{"finance"}, RequestedAt: at(-50 * time.Minute), ExpiresAt: at(40 * time.Minute), Status: approvals.StatusApproved,
			Decision:    &approvals.Decision{Status: approvals.StatusApproved, Approver: bob, Comment: "order checked", DecidedAt: at(-10 * time.Minute)},
			RequestedBy: "0197d2a0-0000-7000-8000-0000000000a2"},
		{ID: "0197d2a0-0000-7000-8000-000000000003", CapabilityID: "email.send", Actor: envelope.Actor{Kind: "agent", ID: "support-bot"},
			SideEffect: "external", Input: json.RawMessage(`{}`), InputHash: "99914b932bd37a50b983c5e7c90ae93b",
			RequestedAt: at(-26 * time.Hour), ExpiresAt: at(-25 * time.Hour), Status: approvals.StatusConsumed,
			Decision:    &approvals.Decision{Status: approvals.StatusApproved, Approver: bob, DecidedAt: at(-25*time.Hour - 30*time.Minute)},
			RequestedBy: "0197d2a0-0000-7000-8000-0000000000a3", ConsumedBy: "0197d2a0-0000-7000-8000-0000000000b3",
			ConsumedAt: at(-25*time.Hour - 20*time.Minute)},
	}
}

func sampleStatuses() map[string]*executor.ExecutionStatus {
	out, _ := envelope.RawFromJSON([]byte(`{"hello":"world"}`))
	at := func(d time.Duration) time.Time { return goldenNow.Add(d) }
	id := "0197d2a0-0000-7000-8000-0000000000c1"
	return map[string]*executor.ExecutionStatus{
		"completed": {
			Record: &execution.Record{ExecutionID: id, CapabilityID: "demo.echo", State: execution.StateFinalized, Attempt: 1,
				Worker: "host-1-ab12", Status: envelope.StatusCompleted, CreatedAt: at(-2 * time.Minute), UpdatedAt: at(-2 * time.Minute)},
			Envelope: &envelope.Envelope{ExecutionID: id, CapabilityID: "demo.echo", Status: envelope.StatusCompleted, Output: out,
				Attempts: 1, DurationMs: 12, FinalizedBy: "host-1-ab12", FinalizedAt: at(-2 * time.Minute)},
		},
		"failed": {
			Record: &execution.Record{ExecutionID: id, CapabilityID: "demo.sleep", State: execution.StateFinalized, Attempt: 2,
				Worker: "host-2-cd34", Status: envelope.StatusCancelled, Cause: "context deadline exceeded",
				CreatedAt: at(-90 * time.Second)},
			Envelope: &envelope.Envelope{ExecutionID: id, CapabilityID: "demo.sleep", Status: envelope.StatusCancelled,
				Error: &envelope.Error{Code: envelope.CodeTimeout, Message: "The operation did not finish within 1s.", Retryable: true,
					ExposeToModel: true, Stage: envelope.StageTimeout},
				Attempts: 2, DurationMs: 2260, FinalizedBy: "host-2-cd34", FinalizedAt: at(-87 * time.Second)},
		},
		"running": {
			Record: &execution.Record{ExecutionID: id, CapabilityID: "email.send", State: execution.StateRunning, Attempt: 1,
				Worker: "host-1-ab12", LeaseUntil: at(25 * time.Second), StartedAt: at(-5 * time.Second), CancelRequested: true,
				CreatedAt: at(-5 * time.Second), Progress: &envelope.Progress{V: 1, ExecutionID: id, Attempt: 1, Done: 37, Total: 120,
					Message: "page 37\x1b[2J rendered", At: at(-2 * time.Second)}},
		},
		"held": {
			Record: &execution.Record{ExecutionID: id, CapabilityID: "email.send", State: execution.StateClaimed,
				LeaseUntil: at(-4 * time.Second), CreatedAt: at(-9 * time.Second), CancelRequested: true},
		},
		"recovered": {
			Record: &execution.Record{ExecutionID: id, CapabilityID: "email.send", State: execution.StateRunning, Attempt: 1,
				Worker: "host-1-ab12", CreatedAt: at(-3 * time.Minute)},
			Envelope: &envelope.Envelope{ExecutionID: id, CapabilityID: "email.send", Status: envelope.StatusCompleted,
				Output: out, Attempts: 1, DurationMs: 31020, FinalizedBy: "host-2-cd34", FinalizedAt: at(-150 * time.Second),
				Recovered: &envelope.Recovered{How: envelope.RecoveredByReceipt, Attempt: 1}},
		},
		"approval-required": {
			Envelope: &envelope.Envelope{ExecutionID: id, CapabilityID: "orders.refund", Status: envelope.StatusApprovalRequired,
				Approval: &envelope.ApprovalRef{ID: "0197d2a0-0000-7000-8000-000000000001", Reasons: []string{"amount above 500"},
					Types: []string{"finance"}, ExpiresAt: at(14 * time.Minute)},
				DurationMs: 8, FinalizedBy: "host-1-ab12", FinalizedAt: at(-time.Minute)},
		},
	}
}

func sampleDiscovery() *executor.Discovery {
	return &executor.Discovery{ID: "0197d2a0-0000-7000-8000-0000000000d1", Surface: executor.SurfaceDirect, Digest: "3f79bb7b435b05321651daefd374cdc681dc06faa65e374e38337b88ca046dea",
		Capabilities: []executor.Descriptor{
			{ID: "demo.echo", Pool: "default", Description: "Returns its input.", SideEffect: executor.SideEffectNone},
			{ID: "demo.flaky", Pool: "default", Description: "Fails retryably while its attempt number is at most failTimes.",
				SideEffect: executor.SideEffectRead, RetryMaxAttempts: 2},
			{ID: "orders.lookup", Pool: "payments", Description: "Reads an order.", SideEffect: executor.SideEffectRead,
				Idempotent: true, Unclaimed: true},
			{ID: "orders.refund", Pool: "payments", Description: "Refunds an order; above 500 a finance approval is required before the refund is recorded.",
				SideEffect: executor.SideEffectWrite, Risk: executor.RiskHigh, Idempotent: true, RetryMaxAttempts: 1, RequiresApproval: true},
		}}
}

func sampleTrail() []audit.Event {
	at := func(ms int) time.Time { return goldenNow.Add(time.Duration(ms) * time.Millisecond) }
	base := audit.Event{Surface: "direct", Actor: audit.Actor{ID: "alice", Kind: "user"},
		ExecutionID: "0197d2a0-0000-7000-8000-0000000000c1", CapabilityID: "demo.flaky", Worker: "host-1-ab12",
		TraceID: "4bf92f3577b34da6a3ce929d0e0e4736"}
	ev := func(ms int, typ string, data map[string]any) audit.Event {
		e := base
		e.Type, e.Timestamp, e.Data = typ, at(ms), data
		return e
	}
	return []audit.Event{
		ev(0, audit.EventRequested, nil),
		ev(3, audit.EventStarted, map[string]any{"attempt": 1, "approvalId": ""}),
		ev(5, audit.EventRetried, map[string]any{"attempt": 2, "previousErrorCode": "EXECUTION_FAILED"}),
		ev(257, audit.EventStarted, map[string]any{"attempt": 2}),
		ev(260, audit.EventCompleted, map[string]any{"attempts": 2, "durationMs": 260}),
		ev(400, audit.EventReceiptRecorded, map[string]any{"attempt": 1, "receiptHash": "5f2b0e1c", "bytes": 18}),
		ev(500, audit.EventReconciled, map[string]any{"attempt": 1, "verdict": "found", "provesAbsence": true, "durationMs": 3}),
		ev(501, audit.EventCompleted, map[string]any{"attempts": 1, "durationMs": 31020, "recovered": "reconciler", "recoveredAttempt": 1}),
		ev(900, audit.EventDenied, map[string]any{"reason": "input-invalid", "publicCode": "INPUT_INVALID",
			"policyDecisions": []any{map[string]any{"policy": "limits", "stance": "allow"}}}),
	}
}

// The human printers, plain and in colour, against their golden files.
func TestGolden_HumanOutput(t *testing.T) {
	t.Parallel()
	for _, color := range []bool{false, true} {
		st := style{color: color, now: goldenNow}
		suffix := ""
		if color {
			suffix = "-color"
		}
		render := func(name string, write func(b *bytes.Buffer)) {
			t.Run(name+suffix, func(t *testing.T) {
				var b bytes.Buffer
				write(&b)
				golden(t, name+suffix, b.Bytes())
			})
		}
		render("approvals-list", func(b *bytes.Buffer) { writeApprovalList(b, st, sampleApprovals()) })
		render("approvals-list-empty", func(b *bytes.Buffer) { writeApprovalList(b, st, nil) })
		render("approvals-show", func(b *bytes.Buffer) {
			for i, r := range sampleApprovals() {
				if i > 0 {
					b.WriteString("\n")
				}
				writeApproval(b, st, r)
			}
		})
		render("status", func(b *bytes.Buffer) {
			all := sampleStatuses()
			for i, name := range []string{"completed", "failed", "running", "approval-required", "recovered", "held"} {
				if i > 0 {
					b.WriteString("\n")
				}
				writeStatus(b, st, all[name])
			}
		})
		render("describe", func(b *bytes.Buffer) { writeDiscovery(b, st, sampleDiscovery()) })
		render("audit-trail", func(b *bytes.Buffer) {
			for _, ev := range sampleTrail() {
				_ = auditLine(b, st, &ev, false)
			}
		})
		render("audit-follow", func(b *bytes.Buffer) {
			for _, ev := range sampleTrail() {
				_ = auditLine(b, st, &ev, true)
			}
		})
		// An envelope refused before it was published names no worker; an
		// input's issues show one a line, none cut.
		render("envelope", func(b *bytes.Buffer) {
			writeEnvelope(b, st, &envelope.Envelope{V: envelope.Version, ExecutionID: "0197d2a0-0000-7000-8000-0000000000d1",
				CapabilityID: "orders.*", Status: envelope.StatusFailed, FinalizedAt: goldenNow.Add(-time.Second),
				Error: &envelope.Error{Code: envelope.CodeCapabilityNotFound, Stage: envelope.StageResolve, ExposeToModel: true, Message: "No such capability."}})
			b.WriteString("\n")
			writeEnvelope(b, st, &envelope.Envelope{V: envelope.Version, ExecutionID: "0197d2a0-0000-7000-8000-0000000000d2",
				CapabilityID: "orders.refund", Status: envelope.StatusFailed, FinalizedAt: goldenNow.Add(-time.Minute), FinalizedBy: "w-1",
				Error: &envelope.Error{Code: envelope.CodeInputInvalid, Stage: envelope.StageInput, ExposeToModel: true, Message: "The input is invalid.",
					Details: map[string]any{"issues": []any{
						map[string]any{"path": "orderId", "message": "expected a string, got an integer"},
						map[string]any{"path": "amount", "message": "expected an integer from -9223372036854775808 to 9223372036854775807, got a string"},
					}}}})
			// An issue of the input as a whole has no path: its message alone.
			b.WriteString("\n")
			writeEnvelope(b, st, &envelope.Envelope{V: envelope.Version, ExecutionID: "0197d2a0-0000-7000-8000-0000000000d3",
				CapabilityID: "demo.echo", Status: envelope.StatusFailed, FinalizedAt: goldenNow.Add(-time.Minute), FinalizedBy: "w-1",
				Error: &envelope.Error{Code: envelope.CodeInputInvalid, Stage: envelope.StageInput, ExposeToModel: true, Message: "The input is invalid.",
					Details: map[string]any{"issues": []any{map[string]any{"message": "expected an object, got an array"}}}}})
		})
		render("cancel", func(b *bytes.Buffer) {
			writeCancelReply(b, st, &executor.CancelReply{ExecutionID: "0197d2a0-0000-7000-8000-0000000000c1", State: execution.StateRunning})
			writeCancelReply(b, st, &executor.CancelReply{ExecutionID: "0197d2a0-0000-7000-8000-0000000000c1", Finalized: true,
				Status: envelope.StatusCompleted})
		})
	}
}

// Colour is for a terminal only: the plain output has no escape sequence,
// and stripping the colour output's escapes gives the plain output back, so
// colour changes nothing of a table's alignment.
func TestGolden_ColorOnlyPaints(t *testing.T) {
	t.Parallel()
	plain, painted := style{now: goldenNow}, style{color: true, now: goldenNow}
	var a, b bytes.Buffer
	writeApprovalList(&a, plain, sampleApprovals())
	writeApprovalList(&b, painted, sampleApprovals())
	if strings.Contains(a.String(), "\x1b") {
		t.Fatalf("plain output holds escape sequences:\n%s", a.String())
	}
	if !strings.Contains(b.String(), ansiGreen) {
		t.Fatalf("colour output has no colour:\n%s", b.String())
	}
	if got := stripANSI(b.String()); got != a.String() {
		t.Fatalf("colour output without its escapes:\n%s\nplain:\n%s", got, a.String())
	}
}

func stripANSI(s string) string {
	var out strings.Builder
	for {
		i := strings.IndexByte(s, 0x1b)
		if i < 0 {
			out.WriteString(s)
			return out.String()
		}
		out.WriteString(s[:i])
		j := strings.IndexByte(s[i:], 'm')
		s = s[i+j+1:]
	}
}

// A redirected stdout is not a terminal: no colour, whatever TERM says.
func TestColorsWanted_NotOnAFileOrPipe(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "out")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	t.Setenv("TERM", "xterm-256color")
	if colorsWanted(f) {
		t.Fatal("colours wanted on a file")
	}
}

// Through the binary: status prints a summary for a person by default, the
// JSON of old with -o json or --json, and refuses an unknown format as a
// usage error.
func TestStatus_SummaryByDefaultJSONOnRequest(t *testing.T) {
	t.Parallel()
	_, url := startDev(t)
	stdout, stderr, code := capstan(t, url, "call", "-o", "json", "demo.echo", "--input", `{"hello":"world"}`)
	if code != exitOK {
		t.Fatalf("call: exit %d, stderr %s", code, stderr)
	}
	id := decode[printedEnvelope](t, stdout).ExecutionID

	stdout, stderr, code = capstan(t, url, "status", id)
	if code != exitOK {
		t.Fatalf("status: exit %d, stderr %s", code, stderr)
	}
	for _, want := range []string{"Execution   " + id + "\n", "Status      completed\n", "Output      {\"hello\":\"world\"}\n"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("status summary lacks %q:\n%s", want, stdout)
		}
	}
	if strings.Contains(stdout, "\x1b") {
		t.Errorf("colour in output to a pipe:\n%q", stdout)
	}
	for _, flag := range [][]string{{"--json"}, {"-o", "json"}} {
		stdout, _, code = capstan(t, url, append([]string{"status", id}, flag...)...)
		var s struct {
			Envelope printedEnvelope `json:"envelope"`
		}
		if err := json.Unmarshal([]byte(stdout), &s); err != nil || code != exitOK || s.Envelope.Status != "completed" {
			t.Errorf("status %v: exit %d, %v, stdout %s", flag, code, err, stdout)
		}
	}
	if _, stderr, code := capstan(t, url, "status", id, "-o", "yaml"); code != exitUsage || !strings.Contains(stderr, "want text or json") {
		t.Errorf("-o yaml: exit %d, stderr %s", code, stderr)
	}
}

// Every command says its help and its flag errors in one form: -h prints the
// synopsis and flags on stdout and exits 0; an unknown flag is named on
// stderr, after "capstan CMD:", with the synopsis, and exits 2.
func TestHelpAndFlagErrors_OneFormAcrossCommands(t *testing.T) {
	t.Parallel()
	for _, name := range commandNames() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			args := strings.Fields(name)
			stdout, stderr, code := capstan(t, "nats://127.0.0.1:1", append(args, "-h")...)
			if code != exitOK || !strings.HasPrefix(stdout, "usage: capstan "+name+" ") || !strings.Contains(stdout, "\nflags:\n") {
				t.Errorf("%s -h: exit %d, stdout %q, stderr %q", name, code, stdout, stderr)
			}
			stdout, stderr, code = capstan(t, "nats://127.0.0.1:1", append(args, "--no-such-flag")...)
			if code != exitUsage || stdout != "" ||
				!strings.HasPrefix(stderr, "capstan "+name+": flag provided but not defined: -no-such-flag\nusage: capstan "+name+" ") {
				t.Errorf("%s --no-such-flag: exit %d, stdout %q, stderr %q", name, code, stdout, stderr)
			}
		})
	}
}

// A duration flag given a number without a unit, or a unit Go does not
// know, says what it wants, on every command that has one; its help still
// names the flag's type.
func TestDurationFlags_BadValueSaysWhatIsWanted(t *testing.T) {
	t.Parallel()
	durationFlag := regexp.MustCompile(`(?m)^  -([a-z-]+) duration$`)
	seen := 0
	for _, name := range commandNames() {
		args := strings.Fields(name)
		help, _, _ := capstan(t, "nats://127.0.0.1:1", append(args, "-h")...)
		for i, m := range durationFlag.FindAllStringSubmatch(help, -1) {
			seen++
			bad := []string{"5", "1x"}[i%2]
			stdout, stderr, code := capstan(t, "nats://127.0.0.1:1", append(args, "--"+m[1], bad)...)
			// Flags that take days too (90d) say so in their own words.
			want := fmt.Sprintf("capstan %s: invalid value %q for flag -%s: want a duration ", name, bad, m[1])
			first, usage, _ := strings.Cut(stderr, "\n")
			if code != exitUsage || stdout != "" || !strings.HasPrefix(first, want) || !strings.Contains(usage, m[0]+"\n") {
				t.Errorf("%s --%s %s: exit %d, stdout %q, stderr's first line %q", name, m[1], bad, code, stdout, first)
			}
		}
	}
	if seen == 0 {
		t.Fatal("no command's help lists a duration flag")
	}
}

// commandNames lists every command and subcommand, as typed after capstan.
func commandNames() []string {
	var names []string
	for _, c := range commands {
		switch c.name {
		case "approvals":
			for _, s := range approvalsCommands {
				names = append(names, "approvals "+s.name)
			}
		case "admin":
			names = append(names, "admin replicas")
		case "auth":
			names = append(names, "auth init", "auth add", "auth list", "auth push")
		case "policy":
			for _, sub := range []string{"apply", "test", "show", "history", "remove", "schema"} {
				names = append(names, "policy "+sub)
			}
		default:
			names = append(names, c.name)
		}
	}
	return names
}
