package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/demo"
)

// printedApproval is an approval as the CLI prints it.
type printedApproval struct {
	ID          string         `json:"id"`
	Status      string         `json:"status"`
	Input       map[string]any `json:"input"`
	InputHash   string         `json:"inputHash"`
	ConsumedBy  string         `json:"consumedBy"`
	RequestedBy string         `json:"requestedBy"`
	Decision    *struct {
		Approver envelope.Actor `json:"approver"`
		Comment  string         `json:"comment"`
	} `json:"decision"`
}

// refundNeedingApproval calls orders.refund above 500 as alice and returns the
// approval id of its approval-required envelope (exit 3).
func refundNeedingApproval(t *testing.T, url string) string {
	t.Helper()
	stdout, stderr, code := capstan(t, url, "call", "-o", "json", "orders.refund", "--input", `{"orderId":"o1","amount":900}`, "--actor", "user:alice")
	if code != exitApproval {
		t.Fatalf("call: exit %d, want %d; stdout %s stderr %s", code, exitApproval, stdout, stderr)
	}
	env := decode[struct {
		Status   string `json:"status"`
		Approval struct {
			ID        string    `json:"id"`
			Reasons   []string  `json:"reasons"`
			Types     []string  `json:"types"`
			ExpiresAt time.Time `json:"expiresAt"`
		} `json:"approval"`
	}](t, stdout)
	if env.Status != "approval-required" || env.Approval.ID == "" || len(env.Approval.Reasons) == 0 || env.Approval.ExpiresAt.IsZero() {
		t.Fatalf("envelope %s", stdout)
	}
	return env.Approval.ID
}

// The demo's walk-through: a refund of 900 exits 3; bob approves; the resume
// completes; a second resume is refused APPROVAL_CONSUMED.
func TestCLI_RefundApprovalApproveResumeOnce(t *testing.T) {
	t.Parallel()
	_, url := startDev(t)
	id := refundNeedingApproval(t, url)

	stdout, stderr, code := capstan(t, url, "approvals", "list", "--status", "pending", "--json")
	if code != exitOK || !strings.Contains(stdout, id) {
		t.Fatalf("list: exit %d, stdout %s stderr %s", code, stdout, stderr)
	}
	stdout, _, code = capstan(t, url, "approvals", "approve", id, "--approver", "user:bob", "--comment", "order checked", "--json")
	a := decode[printedApproval](t, stdout)
	if code != exitOK || a.Status != "approved" || a.Decision.Approver.String() != "user:bob" || a.Decision.Comment != "order checked" {
		t.Fatalf("approve: exit %d, %s", code, stdout)
	}
	stdout, stderr, code = capstan(t, url, "resume", "-o", "json", id)
	done := decode[printedEnvelope](t, stdout)
	if code != exitOK || done.Status != "completed" {
		t.Fatalf("resume: exit %d, stdout %s stderr %s", code, stdout, stderr)
	}
	stdout, _, code = capstan(t, url, "resume", "-o", "json", id)
	again := decode[printedEnvelope](t, stdout)
	if code != exitFailed || again.Status != "failed" || again.Error.Code != "APPROVAL_CONSUMED" {
		t.Fatalf("second resume: exit %d, %s", code, stdout)
	}
	stdout, _, code = capstan(t, url, "approvals", "show", id, "-o", "json")
	shown := decode[printedApproval](t, stdout)
	if code != exitOK || shown.Status != "consumed" || shown.ConsumedBy != done.ExecutionID || shown.Input["amount"] != float64(900) {
		t.Fatalf("show: exit %d, %s", code, stdout)
	}

	// The requesting execution's trail ends with bob's decision; the resume's
	// shows the approval consumed.
	for _, tc := range []struct {
		execID string
		want   []string
	}{
		{shown.RequestedBy, []string{"capability.requested user:alice", "capability.approval_requested user:alice", "capability.approved user:bob"}},
		{done.ExecutionID, []string{"capability.requested user:alice", "approval.consumed user:alice", "capability.started user:alice", "capability.completed user:alice"}},
	} {
		stdout, stderr, code := capstan(t, url, "audit", tc.execID, "--json")
		if code != exitOK {
			t.Fatalf("audit: exit %d, stderr %s", code, stderr)
		}
		var got []string
		for _, line := range strings.Split(strings.TrimSpace(stdout), "\n") {
			ev := decode[struct {
				Type  string         `json:"type"`
				Actor envelope.Actor `json:"actor"`
			}](t, line)
			got = append(got, ev.Type+" "+ev.Actor.String())
		}
		if strings.Join(got, ", ") != strings.Join(tc.want, ", ") {
			t.Fatalf("audit %s:\n got %v\nwant %v", tc.execID, got, tc.want)
		}
	}
}

// The requester cannot approve their own call, and a resume of an approval
// that is pending, rejected or expired ends with the matching code.
func TestCLI_SelfApprovalAndUnusableApprovals(t *testing.T) {
	t.Parallel()
	_, url := startDev(t)

	pending := refundNeedingApproval(t, url)
	_, stderr, code := capstan(t, url, "approvals", "approve", pending, "--approver", "user:alice")
	if code != exitFailed || !strings.Contains(stderr, "APPROVAL_SELF_APPROVAL") || !strings.Contains(stderr, "another approver decides it") ||
		!strings.Contains(stderr, "'capstan approvals approve "+pending+" --approver user:alice --self-approval REASON'") {
		t.Fatalf("self-approval: exit %d, stderr %s", code, stderr)
	}
	// A rejection has no reason that lifts it: another approver only.
	_, stderr, code = capstan(t, url, "approvals", "reject", pending, "--approver", "user:alice")
	if code != exitFailed || !strings.Contains(stderr, "another approver decides it") || strings.Contains(stderr, "--self-approval") {
		t.Fatalf("self-rejection: exit %d, stderr %s", code, stderr)
	}
	// The way out it names works, the reason kept with the decision.
	selfApproved := refundNeedingApproval(t, url)
	stdout, stderr, code := capstan(t, url, "approvals", "approve", selfApproved, "--approver", "user:alice", "--self-approval", "on call alone tonight", "-o", "json")
	if rec := decode[struct {
		Status   string
		Decision struct{ SelfApproval string }
	}](t, stdout); code != exitOK || rec.Status != "approved" || rec.Decision.SelfApproval != "on call alone tonight" {
		t.Fatalf("approve --self-approval: exit %d, stdout %s, stderr %s", code, stdout, stderr)
	}
	rejected := refundNeedingApproval(t, url)
	if _, stderr, code := capstan(t, url, "approvals", "reject", rejected, "--approver", "user:bob"); code != exitOK {
		t.Fatalf("reject: exit %d, stderr %s", code, stderr)
	}
	expired := refundNeedingApproval(t, url)
	if _, stderr, code := capstan(t, url, "approvals", "approve", expired, "--approver", "user:bob"); code != exitOK {
		t.Fatalf("approve: exit %d, stderr %s", code, stderr)
	}
	expire(t, url, expired)

	for _, tc := range []struct{ id, code string }{
		{pending, "APPROVAL_PENDING"},
		{rejected, "APPROVAL_REJECTED"},
		{expired, "APPROVAL_EXPIRED"},
	} {
		stdout, stderr, code := capstan(t, url, "resume", "-o", "json", tc.id)
		env := decode[printedEnvelope](t, stdout)
		if code != exitFailed || env.Status != "failed" || env.Error == nil || env.Error.Code != tc.code {
			t.Fatalf("resume: exit %d, stdout %s stderr %s; want %s", code, stdout, stderr, tc.code)
		}
	}
	stdout, _, _ = capstan(t, url, "approvals", "list", "--status", "expired", "--json")
	if page := decode[struct{ Records []printedApproval }](t, stdout); len(page.Records) != 1 || page.Records[0].ID != expired {
		t.Fatalf("expired: %s", stdout)
	}
	for _, args := range [][]string{
		{"approvals", "approve", pending},
		{"approvals", "approve", pending, "--approver", "bob"},
		{"approvals", "list", "--status", "later"},
		{"approvals", "frobnicate"},
		{"resume"},
	} {
		if _, stderr, code := capstan(t, url, args...); code != exitUsage || stderr == "" {
			t.Errorf("%v: exit %d, stderr %q", args, code, stderr)
		}
	}
	if _, _, code := capstan(t, url, "resume", "-o", "json", envelope.NewExecutionID()); code != exitFailed {
		t.Errorf("resume of an unknown approval: exit %d", code)
	}
}

// expire moves an approval's expiry into the past, as time would.
func expire(t *testing.T, url, id string) {
	t.Helper()
	ctx := context.Background()
	b, err := broker.Provision(ctx, connect(t, url), broker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	r, rev, err := broker.Load[approvals.Record](ctx, b.Approvals, id)
	if err != nil {
		t.Fatal(err)
	}
	r.ExpiresAt = time.Now().Add(-time.Second)
	if _, err := broker.Update(ctx, b.Approvals, id, r, rev); err != nil {
		t.Fatal(err)
	}
}

func TestCLI_ApproveWithResume(t *testing.T) {
	t.Parallel()
	_, url := startDev(t)
	id := refundNeedingApproval(t, url)
	stdout, stderr, code := capstan(t, url, "approvals", "approve", id, "--approver", "user:bob", "--resume", "-o", "json")
	env := decode[printedEnvelope](t, stdout)
	if code != exitOK || env.Status != "completed" || !strings.Contains(stderr, "approved by user:bob") {
		t.Fatalf("approve --resume: exit %d, stdout %s stderr %s", code, stdout, stderr)
	}
}

// Three `capstan worker` processes serve 50 goroutines resuming one approval
// at once: one refund is recorded, every other resume is APPROVAL_CONSUMED.
// (The executor's tests repeat this a hundred times with worker processes of
// their own; here it runs with the real binary.)
func TestCLI_ResumeRaceAcrossWorkerProcesses(t *testing.T) {
	t.Parallel()
	port := freePort(t)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	startDaemon(t, "capstan server listening on", nil, "server", "--store", t.TempDir(), "--listen", fmt.Sprintf("127.0.0.1:%d", port))
	for i := 1; i <= 3; i++ {
		startDaemon(t, "worker started", []string{"CAPSTAN_NATS_URL=" + url}, "worker", "--id", fmt.Sprintf("approvals-%d", i), "--concurrency", "8")
	}
	c, err := executor.NewClient(connect(t, url), executor.ClientConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	js, err := jetstream.New(connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	refunds, err := js.KeyValue(ctx, demo.RefundsBucket)
	if err != nil {
		t.Fatal(err)
	}

	for round := 0; round < 10; round++ {
		id := refundNeedingApproval(t, url)
		if _, err := c.Decide(ctx, id, approvals.Verdict{Approve: true, Approver: envelope.Actor{Kind: "user", ID: "bob"}}); err != nil {
			t.Fatal(err)
		}
		envs := make([]*envelope.Envelope, 50)
		errs := make([]error, len(envs))
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range envs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				envs[i], errs[i] = c.Resume(ctx, id)
			}()
		}
		close(start)
		wg.Wait()
		completed := 0
		for i, env := range envs {
			switch {
			case errs[i] != nil:
				t.Fatalf("round %d: resume %d: %v", round, i, errs[i])
			case env.Status == envelope.StatusCompleted:
				completed++
				// The demo refund is keyed by the execution's idempotency key.
				if _, err := refunds.Get(ctx, envelope.IdempotencyKey(broker.Anonymous, env.ExecutionID)); err != nil {
					t.Fatalf("round %d: no refund recorded by %s: %v", round, env.ExecutionID, err)
				}
			case env.Error == nil || env.Error.Code != envelope.CodeApprovalConsumed:
				t.Fatalf("round %d: %s %+v", round, env.Status, env.Error)
			}
		}
		if completed != 1 {
			t.Fatalf("round %d: %d resumes completed", round, completed)
		}
	}
	keys, err := refunds.ListKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for range keys.Keys() {
		n++
	}
	if n != 10 {
		t.Fatalf("%d refunds recorded over 10 approvals", n)
	}
}
