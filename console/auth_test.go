package console_test

import (
	"context"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/auth"
	"github.com/capstan-dev/capstan/console"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/approvalstore"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// secured is a server with capstan's authentication: alice produces, bob
// decides finance approvals, carol security ones; the admin provisioned the
// resources and published the grants.
func secured(t *testing.T) (*testenv.Env, *auth.Setup) {
	t.Helper()
	setup, err := auth.Init(t.TempDir(), "")
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range []auth.Grant{
		{Principal: "alice", Role: auth.RoleProducer, Actors: []string{"user:alice"}, Capabilities: []string{"*"}},
		{Principal: "bob", Role: auth.RoleApprover, Actors: []string{"user:bob"}, Types: []string{"finance"}},
		{Principal: "carol", Role: auth.RoleApprover, Actors: []string{"user:carol"}, Types: []string{"security"}},
	} {
		if err := setup.Add(g); err != nil {
			t.Fatal(err)
		}
	}
	env := testenv.Start(t, testenv.Auth(setup))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	b, err := broker.Provision(ctx, env.Connect(t), broker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := auth.PublishGrants(ctx, b.JS, setup, 0); err != nil {
		t.Fatal(err)
	}
	return env, setup
}

func credsOf(t *testing.T, setup *auth.Setup, principal string) string {
	t.Helper()
	b, err := os.ReadFile(setup.CredsPath(principal))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Against a server with authentication nothing is readable before sign-in;
// an approver signs in with its credentials and decides as the identity its
// grant gives, through the workers; an approval outside its types is refused;
// what its role may not read, it is told so.
func TestSignIn_ApproverDecidesAsItsPrincipal(t *testing.T) {
	t.Parallel()
	env, setup := secured(t)
	workerCreds := setup.CredsPath(auth.WorkerPrincipal)
	r := startRig(t, env.URL, console.Config{},
		nats.UserCredentials(workerCreds), nats.CustomInboxPrefix(broker.NewNames(setup.Prefix).InboxPrefix(auth.WorkerPrincipal)))
	alice, err := executor.NewClient(env.ConnectAs(t, "alice"), executor.ClientConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer alice.Close()
	env1, err := alice.Call(testCtx(t), "orders.refund", refund(900), executor.As(aliceActor))
	if err != nil || env1.Status != envelope.StatusApprovalRequired {
		t.Fatalf("refund of 900: %v, %v", env1, err)
	}

	anon := newWeb(t, r.base)
	for _, p := range []string{"/", "/approvals", "/approvals/" + env1.Approval.ID, "/executions", "/executions/" + env1.ExecutionID, "/capabilities"} {
		// The sign-in page carries the path asked for, nothing read from JetStream.
		if _, path, body := anon.get(p); path != "/signin" || strings.Contains(body, "orders.refund") || strings.Contains(body, "alice") {
			t.Errorf("GET %s without sign-in ended at %s", p, path)
		}
	}
	for _, p := range []string{"/approvals?part=list", "/live/approvals", "/live/executions", "/executions/" + env1.ExecutionID + "?part=main"} {
		if status, _, body := anon.get(p); status != http.StatusUnauthorized || strings.Contains(body, "orders.refund") {
			t.Errorf("GET %s without sign-in: %d, want 401", p, status)
		}
	}
	if status, _, _ := anon.post("/approvals/"+env1.Approval.ID+"/decide", url.Values{"decision": {"approve"}}); status != http.StatusUnauthorized {
		t.Errorf("decide without sign-in: %d, want 401", status)
	}

	// Credentials of another deployment are refused by the server.
	other, err := auth.Init(t.TempDir(), "")
	if err != nil {
		t.Fatal(err)
	}
	if status, _, body := anon.post("/signin", url.Values{"creds": {credsOf(t, other, auth.AdminPrincipal)}}); status != http.StatusUnauthorized {
		t.Fatalf("foreign credentials: %d, want 401:\n%s", status, body)
	}

	carol := newWeb(t, r.base)
	if _, path, body := carol.post("/signin", url.Values{"creds": {credsOf(t, setup, "carol")}, "next": {"/approvals"}}); path != "/approvals" {
		t.Fatalf("carol's sign-in ended at %s:\n%s", path, body)
	}
	_, _, body := carol.post("/approvals/"+env1.Approval.ID+"/decide", url.Values{"decision": {"approve"}, "next": {"/approvals"}})
	// An approval of types carol may not decide does not exist for her: the
	// refusal is an id of nothing's, and names neither its types nor alice.
	contains(t, "carol's decision", body, "No such approval")
	for _, secret := range []string{"finance", "user:alice"} {
		if strings.Contains(body, secret) {
			t.Errorf("carol's refusal names %s:\n%s", secret, body)
		}
	}

	bob := newWeb(t, r.base)
	_, path, body := bob.post("/signin", url.Values{"creds": {credsOf(t, setup, "bob")}, "next": {"/approvals"}})
	if path != "/approvals" {
		t.Fatalf("bob's sign-in ended at %s:\n%s", path, body)
	}
	contains(t, "bob's inbox", body, `id="principal"`, "bob", `id="a-`+env1.Approval.ID, "user:alice")
	_, _, body = bob.post("/approvals/"+env1.Approval.ID+"/decide", url.Values{"decision": {"approve"}, "comment": {"checked"}, "next": {"/approvals"}})
	contains(t, "bob's decision", body, "Approved orders.refund for user:alice")
	js, err := jetstream.New(env.Connect(t)) // the admin reads the record
	if err != nil {
		t.Fatal(err)
	}
	store, err := approvalstore.Open(testCtx(t), js, setup.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := store.Get(testCtx(t), env1.Approval.ID)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Status != "approved" || rec.Decision.Approver.String() != "user:bob" || rec.Decision.Comment != "checked" {
		t.Fatalf("approval %s, decision %+v; want approved by user:bob", rec.Status, rec.Decision)
	}
	// The approver reads the execution behind his approval: its input (as
	// approvers see it), trail and outcome, and no other.
	if status, _, body := bob.get("/executions"); status != http.StatusOK {
		t.Fatalf("an approver's /executions: %d, want 200:\n%s", status, body)
	} else {
		contains(t, "bob's executions page", body, `id="e-`+env1.ExecutionID+`"`, "behind the approvals you may decide")
	}
	page := bob.waitPage("/executions/"+env1.ExecutionID, `data-type="capability.approved"`)
	contains(t, "bob's view of the refund", page, `id="exec-input"`, `"amount": 900`, `id="timeline"`, "approval requested", `id="envelope"`)
	if strings.Contains(page, `id="cancel"`) {
		t.Fatalf("an approver may cancel alice's execution:\n%s", page)
	}
	echo, err := alice.Call(testCtx(t), "demo.echo", map[string]any{"secret": "of alice"}, executor.As(aliceActor))
	if err != nil {
		t.Fatal(err)
	}
	if status, _, body := bob.get("/executions/" + echo.ExecutionID); status != http.StatusForbidden || strings.Contains(body, "of alice") {
		t.Fatalf("bob reading an execution behind no approval of his: %d, want 403:\n%s", status, body)
	} else {
		contains(t, "bob's refusal", body, "an approver (bob) reads only the executions behind approvals it may decide")
	}

	// The admin reads alice's executions and cancels one of them.
	id, err := alice.Submit(testCtx(t), "email.send", map[string]any{"to": "ada@example.com", "subject": "hi", "delayMs": 60000}, executor.As(aliceActor))
	if err != nil {
		t.Fatal(err)
	}
	admin := newWeb(t, r.base)
	if _, path, body := admin.post("/signin", url.Values{"creds": {credsOf(t, setup, auth.AdminPrincipal)}, "next": {"/executions"}}); path != "/executions" {
		t.Fatalf("the admin's sign-in ended at %s:\n%s", path, body)
	} else {
		contains(t, "the admin's executions", body, "· admin", `id="e-`+env1.ExecutionID+`"`)
	}
	page = admin.waitPage("/executions/"+id, `data-type="capability.started"`)
	contains(t, "the email's page", page, `id="cancel"`)
	_, _, body = admin.post("/executions/"+id+"/cancel", url.Values{})
	if !strings.Contains(body, "Cancel recorded") && !strings.Contains(body, "has ended: cancelled") {
		t.Fatalf("the admin's cancel was not confirmed:\n%s", body)
	}
	if env, err := alice.Await(testCtx(t), id); err != nil || env.Status != envelope.StatusCancelled {
		t.Fatalf("alice's email after the admin's cancel: %v, %v; want cancelled", env, err)
	}
	// The admin reads alice's record and envelope, kept under her principal.
	page = admin.waitPage("/executions/"+id, `id="envelope"`)
	contains(t, "the cancelled email's page", page, `"status": "cancelled"`, "finalized")

	// A producer signs in and sees its own executions, their trails and
	// results; it decides nothing.
	aliceWeb := newWeb(t, r.base)
	if _, path, body := aliceWeb.post("/signin", url.Values{"creds": {credsOf(t, setup, "alice")}, "next": {"/executions"}}); path != "/executions" {
		t.Fatalf("alice's sign-in ended at %s:\n%s", path, body)
	} else {
		contains(t, "alice's executions", body, "· producer", "Your principal's executions")
	}
	// The index lists an execution up to 250 ms after it ended (DESIGN §3).
	page = aliceWeb.waitPage("/executions", `id="e-`+id+`"`)
	contains(t, "alice's executions", page, `id="e-`+echo.ExecutionID+`"`)
	page = aliceWeb.waitPage("/executions/"+echo.ExecutionID, `id="envelope"`)
	contains(t, "alice's echo", page, `"secret": "of alice"`, `data-type="capability.completed"`)
}

var aliceActor = envelope.Actor{Kind: envelope.ActorUser, ID: "alice"}
