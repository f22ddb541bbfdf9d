package console_test

import (
	"html"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/internal/testhooks"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/console"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/approvalstore"
	"github.com/capstan-dev/capstan/internal/demo"
)

func signInOpen(t testing.TB, base, name, types string) *web {
	t.Helper()
	w := newWeb(t, base)
	status, path, body := w.post("/signin", url.Values{"name": {name}, "types": {types}})
	if status != http.StatusOK || path != "/" {
		t.Fatalf("sign-in as %s: %d at %s\n%s", name, status, path, body)
	}
	return w
}

func contains(t testing.TB, what, body string, want ...string) {
	t.Helper()
	body = html.UnescapeString(body)
	for _, s := range want {
		if !strings.Contains(body, s) {
			t.Fatalf("%s lacks %q:\n%s", what, s, body)
		}
	}
}

func refund(amount int64) demo.RefundInput {
	return demo.RefundInput{OrderID: "o-1001", Amount: amount}
}

// A form without the session's token changes nothing.
func TestDecide_RefusedWithoutTheSessionsFormToken(t *testing.T) {
	t.Parallel()
	r := startRig(t, "", console.Config{Open: true})
	env := r.call(t, "orders.refund", refund(900), alice)
	w := signInOpen(t, r.base, "user:bob", "")
	if status, _, _ := w.post("/approvals/"+env.Approval.ID+"/decide", url.Values{"decision": {"approve"}, "csrf": {"forged"}}); status != http.StatusForbidden {
		t.Fatalf("decide with a forged token: %d, want 403", status)
	}
	rec, err := r.client.Approval(testCtx(t), env.Approval.ID)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Status != "pending" {
		t.Fatalf("the approval is %s after a forged form", rec.Status)
	}
}

// Self-approval, a second decision and a decision outside the principal's
// approval types are each refused with a message that says why.
func TestDecide_RefusalsAreShownWithTheirCode(t *testing.T) {
	t.Parallel()
	r := startRig(t, "", console.Config{Open: true})
	env := r.call(t, "orders.refund", refund(900), alice)
	id := env.Approval.ID
	decide := func(w *web) string {
		t.Helper()
		w.get("/approvals")
		_, _, body := w.post("/approvals/"+id+"/decide", url.Values{"decision": {"approve"}, "next": {"/approvals/" + id}})
		return body
	}

	security := signInOpen(t, r.base, "user:sam", "security")
	_, _, inbox := security.get("/approvals")
	if strings.Contains(inbox, `id="a-`+id) {
		t.Fatalf("an approver of security approvals is shown a finance approval")
	}
	contains(t, "sam's inbox", inbox, "1 more pending for other approval types.")
	contains(t, "sam's decision", decide(security), "FORBIDDEN", "needs a finance approver")

	contains(t, "alice's decision", decide(signInOpen(t, r.base, "user:alice", "")), "APPROVAL_SELF_APPROVAL", "you (user:alice) requested this call")
	contains(t, "bob's decision", decide(signInOpen(t, r.base, "user:bob", "finance")), "Approved orders.refund")
	contains(t, "carol's decision", decide(signInOpen(t, r.base, "user:carol", "finance")), "this approval was already approved by user:bob")

	rec, err := r.client.Approval(testCtx(t), id)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Status != "approved" || rec.Decision.Approver.String() != bob.String() {
		t.Fatalf("approval %s by %v, want approved by user:bob alone", rec.Status, rec.Decision.Approver)
	}
}

// Cancel is offered to the execution's owner and to admins; anyone else is
// refused, and the execution goes on.
func TestCancel_OnlyTheOwnerOrAnAdmin(t *testing.T) {
	t.Parallel()
	r := startRig(t, "", console.Config{Open: true})
	ctx := testCtx(t)
	id, err := r.client.Submit(ctx, "email.send", demo.EmailInput{To: "ada@example.com", Subject: "hi", DelayMs: 60000}, executor.As(alice))
	if err != nil {
		t.Fatal(err)
	}
	bobWeb := signInOpen(t, r.base, "user:bob", "")
	page := bobWeb.waitPage("/executions/"+id, `data-type="capability.started"`)
	if strings.Contains(page, `id="cancel"`) {
		t.Fatalf("bob is offered to cancel alice's execution")
	}
	_, _, body := bobWeb.post("/executions/"+id+"/cancel", url.Values{})
	contains(t, "bob's cancel", body, "FORBIDDEN: only the execution's owner (user:alice) or an admin may cancel it.")

	aliceWeb := signInOpen(t, r.base, "user:alice", "")
	_, _, page = aliceWeb.get("/executions/" + id)
	contains(t, "alice's execution page", page, `id="cancel"`)
	_, _, body = aliceWeb.post("/executions/"+id+"/cancel", url.Values{})
	if !strings.Contains(body, "Cancel recorded") && !strings.Contains(body, "has ended: cancelled") {
		t.Fatalf("alice's cancel was not confirmed:\n%s", body)
	}
	env, err := r.client.Await(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if env.Status != envelope.StatusCancelled {
		t.Fatalf("envelope %s, want cancelled", env.Status)
	}
}

// The executions list filters by capability, status and actor, and one
// execution's page shows its retries.
func TestExecutions_FilteredListAndARetryOnTheTimeline(t *testing.T) {
	t.Parallel()
	r := startRig(t, "", console.Config{Open: true})
	echo := r.call(t, "demo.echo", map[string]any{"hello": "world"}, alice)
	flaky := r.call(t, "demo.flaky", demo.FlakyInput{FailTimes: 1}, bob)
	bad := r.call(t, "demo.flaky", demo.FlakyInput{FailTimes: 5}, bob)
	if flaky.Status != envelope.StatusCompleted || bad.Status != envelope.StatusFailed {
		t.Fatalf("flaky %s, bad %s", flaky.Status, bad.Status)
	}
	w := signInOpen(t, r.base, "user:ops", "")
	row := func(id string) string { return `id="e-` + id + `"` }
	// The index lists an execution up to 250 ms after it ended (DESIGN §3).
	for _, id := range []string{echo.ExecutionID, flaky.ExecutionID, bad.ExecutionID} {
		w.waitPage("/executions", row(id))
	}
	for _, c := range []struct {
		query    string
		want     []string
		wantNone []string
	}{
		{"", []string{echo.ExecutionID, flaky.ExecutionID, bad.ExecutionID}, nil},
		{"capability=demo.flaky", []string{flaky.ExecutionID, bad.ExecutionID}, []string{echo.ExecutionID}},
		{"capability=demo.*", []string{echo.ExecutionID, flaky.ExecutionID, bad.ExecutionID}, nil},
		{"status=failed", []string{bad.ExecutionID}, []string{echo.ExecutionID, flaky.ExecutionID}},
		{"actor=user:alice", []string{echo.ExecutionID}, []string{flaky.ExecutionID, bad.ExecutionID}},
		{"actor=bob&status=completed", []string{flaky.ExecutionID}, []string{echo.ExecutionID, bad.ExecutionID}},
	} {
		_, _, body := w.get("/executions?" + c.query)
		for _, id := range c.want {
			if !strings.Contains(body, row(id)) {
				t.Errorf("?%s lacks %s", c.query, id)
			}
		}
		for _, id := range c.wantNone {
			if strings.Contains(body, row(id)) {
				t.Errorf("?%s lists %s", c.query, id)
			}
		}
	}
	for _, p := range []string{"/executions/not-an-id", "/executions/" + envelope.NewExecutionID(), "/approvals/" + envelope.NewExecutionID()} {
		if status, _, _ := w.get(p); status != http.StatusNotFound {
			t.Errorf("GET %s: %d, want 404", p, status)
		}
	}
	// The trail's last events may still be on their way when the envelope arrives.
	body := w.waitPage("/executions/"+flaky.ExecutionID, `data-type="capability.completed"`)
	contains(t, "the flaky execution's page", body, `data-type="capability.retried"`, "retry: attempt 2", "after EXECUTION_FAILED", "attempt 2 started", `"status": "completed"`)
}

// The capabilities page lists the catalog per pool with the worker serving
// it and the pool's queue depth.
func TestCapabilities_CatalogPerPoolWithWorkersAndQueueDepth(t *testing.T) {
	t.Parallel()
	r := startRig(t, "", console.Config{Open: true})
	r.call(t, "orders.refund", refund(10), alice)
	w := signInOpen(t, r.base, "user:ops", "")
	_, _, body := w.get("/capabilities")
	contains(t, "capabilities page", body, `id="pool-default"`, "Pool default", `id="cap-orders.refund"`, `id="cap-demo.echo"`,
		"queued", "in flight", r.worker.ID())
	// demo.echo, served and never called, is said to be served.
	i := strings.Index(body, `id="cap-demo.echo"`)
	row := body[i : i+strings.Index(body[i:], "</tr>")]
	contains(t, "demo.echo's row", row, "served, not called lately")
	if strings.Contains(row, "none lately") || strings.Contains(row, "no live worker") {
		t.Fatalf("a served capability's row: %s", row)
	}
}

// In open mode sign-in names an actor that may decide: a user, service or
// agent with an id.
func TestSignIn_OpenModeNamesAnActorThatMayDecide(t *testing.T) {
	t.Parallel()
	r := startRig(t, "", console.Config{Open: true})
	for _, name := range []string{"", "user:", "bot:x", "user:a b", "user:a:b"} {
		w := newWeb(t, r.base)
		if status, _, body := w.post("/signin", url.Values{"name": {name}}); status != http.StatusUnauthorized {
			t.Errorf("sign-in as %q: %d, want 401", name, status)
		} else {
			contains(t, "the refusal", body, "name yourself as user:ID")
		}
	}
	for name, want := range map[string]string{"bob": "user:bob", "service:billing": "service:billing", "agent:triage": "agent:triage"} {
		w := signInOpen(t, r.base, name, "")
		_, _, body := w.get("/")
		contains(t, "the start page", body, `id="principal"`, want)
	}
}

// A rejection is recorded with its comment; an approval past its expiry is
// refused as expired and listed so.
func TestDecide_RejectWithACommentAndExpiredRefused(t *testing.T) {
	t.Parallel()
	r := startRig(t, "", console.Config{Open: true})
	env := r.call(t, "orders.refund", refund(900), alice)
	w := signInOpen(t, r.base, "user:bob", "")
	w.get("/approvals")
	_, _, body := w.post("/approvals/"+env.Approval.ID+"/decide", url.Values{"decision": {"reject"}, "comment": {"wrong order"}, "next": {"/approvals"}})
	contains(t, "bob's rejection", body, "Rejected orders.refund for user:alice", "rejected</strong> by <span class=\"approver\">user:bob</span>", "wrong order")
	rec, err := r.client.Approval(testCtx(t), env.Approval.ID)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Status != approvals.StatusRejected || rec.Decision.Comment != "wrong order" {
		t.Fatalf("approval %s with %+v, want rejected with the comment", rec.Status, rec.Decision)
	}

	// An approval that expires in a moment.
	input, hash, err := approvalstore.Canonical(envelope.MustRaw(map[string]any{"orderId": "o-2", "amount": 700}))
	if err != nil {
		t.Fatal(err)
	}
	short := &approvals.Record{ID: envelope.NewExecutionID(), CapabilityID: "orders.refund", Actor: alice, Types: []string{"finance"},
		Input: input, InputHash: hash, RequestedBy: envelope.NewExecutionID(), ExpiresAt: time.Now().Add(time.Second)}
	if err := approvalstore.NewStore(testhooks.Broker(r.client).Approvals, nil).Create(testCtx(t), short); err != nil {
		t.Fatal(err)
	}
	w.waitPage("/approvals", `id="a-`+short.ID+`" data-v="expired`)
	_, _, body = w.post("/approvals/"+short.ID+"/decide", url.Values{"decision": {"approve"}, "next": {"/approvals"}})
	contains(t, "a late decision", body, "APPROVAL_EXPIRED: this approval expired before it was decided.")
}

// The console reads executions through the workers alone, as the CLI does:
// with no worker serving, its pages say so (503) instead of showing a
// reading of its own.
func TestExecutions_NoWorkerServingIsSaid(t *testing.T) {
	t.Parallel()
	r := startRig(t, "", console.Config{Open: true})
	env := r.call(t, "demo.echo", map[string]any{"message": "hi"}, alice)
	w := signInOpen(t, r.base, "user:alice", "")
	w.waitPage("/executions", env.ExecutionID)
	r.stopWorker()
	status, _, body := w.get("/executions")
	if status != http.StatusServiceUnavailable {
		t.Fatalf("executions without a worker: %d, want 503\n%s", status, body)
	}
	contains(t, "executions without a worker", body, "no worker is serving")
	if status, _, body := w.get("/executions/" + env.ExecutionID); status != http.StatusServiceUnavailable {
		t.Fatalf("an execution without a worker: %d, want 503\n%s", status, body)
	}
}
