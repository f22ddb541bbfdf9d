package executor_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/auth"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/approvalsrpc"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/demo"
	"github.com/capstan-dev/capstan/internal/execrpc"
	"github.com/capstan-dev/capstan/internal/pauses"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// readers is a secured deployment for the reading rules: alice and gw
// produce, bob approves finance, carol security; a worker serves the demo
// catalog (orders.refund asks finance above 500).
type readers struct {
	env   *testenv.Env
	admin *broker.Broker
	conns map[string]*nats.Conn
}

// secured starts an embedded server that requires the credentials of
// grants, provisioned, its grants published; it returns the server and the
// admin's broker.
func secured(t *testing.T, grants ...auth.Grant) (*testenv.Env, *broker.Broker) {
	t.Helper()
	return securedWith(t, broker.Config{}, grants...)
}

// securedWith is secured with the deployment provisioned as cfg says.
func securedWith(t *testing.T, cfg broker.Config, grants ...auth.Grant) (*testenv.Env, *broker.Broker) {
	t.Helper()
	setup, err := auth.Init(t.TempDir(), "")
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range grants {
		if err := setup.Add(g); err != nil {
			t.Fatal(err)
		}
	}
	env := testenv.Start(t, testenv.Auth(setup))
	admin, err := broker.Provision(ctxT(t), env.Connect(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := auth.PublishGrants(ctxT(t), admin.JS, setup, 0); err != nil {
		t.Fatal(err)
	}
	return env, admin
}

func newReaders(t *testing.T) *readers {
	t.Helper()
	return newReadersWith(t, executor.WorkerConfig{})
}

// newReadersWith is newReaders with its worker (and the deployment it
// provisions) as wc says.
func newReadersWith(t *testing.T, wc executor.WorkerConfig) *readers {
	t.Helper()
	env, admin := securedWith(t, broker.Config(wc.Deployment),
		auth.Grant{Principal: "alice", Role: auth.RoleProducer, Actors: []string{"user:alice"}, Capabilities: []string{"*"}},
		auth.Grant{Principal: "gw", Role: auth.RoleProducer, Actors: []string{"user:*"}, Capabilities: []string{"*"}},
		auth.Grant{Principal: "bob", Role: auth.RoleApprover, Actors: []string{"user:bob"}, Types: []string{"finance"}},
		auth.Grant{Principal: "carol", Role: auth.RoleApprover, Actors: []string{"user:carol"}, Types: []string{"security"}})
	js, err := demo.Provision(ctxT(t), env.Connect(t), 1)
	if err != nil {
		t.Fatal(err)
	}
	startWorker(t, env.ConnectAs(t, auth.WorkerPrincipal), wc, demo.Catalog(js)...)
	r := &readers{env: env, admin: admin, conns: map[string]*nats.Conn{}}
	for _, p := range []string{"alice", "gw", "bob", "carol"} {
		r.conns[p] = env.ConnectAs(t, p)
	}
	return r
}

func (r *readers) client(t *testing.T, p string, actor envelope.Actor) *executor.Client {
	t.Helper()
	c, err := executor.NewClient(r.conns[p], executor.ClientConfig{Actor: actor})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func (r *readers) list(t *testing.T, p string, req executor.ExecutionsRequest) ([]string, error) {
	t.Helper()
	page, err := requestExecutions(ctxT(t), r.conns[p], r.admin.Names, req)
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, e := range page.Entries {
		ids = append(ids, e.ExecutionID)
	}
	return ids, nil
}

func (r *readers) get(t *testing.T, p, id string) (*executor.ExecutionView, error) {
	t.Helper()
	return requestExecution(ctxT(t), r.conns[p], r.admin.Names, executor.ExecutionRequest{ExecutionID: id})
}

// approvedRefund has alice ask for a refund that needs finance's approval,
// and bob approve it.
func (r *readers) approvedRefund(t *testing.T) (alice *executor.Client, refund *envelope.Envelope) {
	t.Helper()
	alice = r.client(t, "alice", envelope.Actor{Kind: "user", ID: "alice"})
	refund, err := alice.Call(ctxT(t), "orders.refund", map[string]any{"orderId": "o-1", "amount": 900})
	if err != nil || refund.Status != envelope.StatusApprovalRequired {
		t.Fatalf("refund: %v %+v", err, refund)
	}
	if _, err := approvalsrpc.Decide(ctxT(t), r.conns["bob"], r.admin.Names,
		approvalsrpc.DecideRequest{ApprovalID: refund.Approval.ID, Approve: true}); err != nil {
		t.Fatal(err)
	}
	return alice, refund
}

// statuses is p's listing for q: each execution's status by its id. A
// listing refused for p's control quota (a test polling) is asked again.
func (r *readers) statuses(t *testing.T, p string, q audit.Query) map[string]string {
	t.Helper()
	for {
		page, err := requestExecutions(ctxT(t), r.conns[p], r.admin.Names, executor.ExecutionsRequest{Query: q})
		if errors.Is(err, envelope.ErrQuotaExceeded) {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for _, e := range page.Entries {
			got[e.ExecutionID] = e.Status
		}
		return got
	}
}

// An approver's listing shows a resume that a pause holds as queued, as the
// other listings do, not as running; once the pause ends, as it ended.
func TestReading_AnApproverSeesAHeldResumeQueued(t *testing.T) {
	t.Parallel()
	r := newReaders(t)
	alice, refund := r.approvedRefund(t)
	admin := r.env.Connect(t)
	pause(t, admin, pauses.Pause{Scope: pauses.Scope{Capability: "orders.refund"}})
	id, err := alice.SubmitResume(ctxT(t), refund.Approval.ID)
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the held resume listed queued for its approver", func() bool {
		return r.statuses(t, "bob", audit.Query{})[id] == audit.EntryQueued
	})
	unpause(t, admin, pauses.Scope{Capability: "orders.refund"})
	if done, err := alice.Await(ctxT(t), id); err != nil || done.Status != envelope.StatusCompleted {
		t.Fatalf("the resume after the pause: %v %+v", err, done)
	}
	if got := r.statuses(t, "bob", audit.Query{})[id]; got != string(envelope.StatusCompleted) {
		t.Fatalf("the ended resume is listed %q for its approver, want %q", got, envelope.StatusCompleted)
	}
}

// Once a resume's envelope expired (and its record went), its approver's
// listing no longer shows it running: the approval (kept longer) says it
// was consumed, and nothing says how it ended any more.
func TestReading_AnApproverNoLongerSeesAResumeWhoseEnvelopeExpired(t *testing.T) {
	t.Parallel()
	const retention = 6 * time.Second
	r := newReadersWith(t, executor.WorkerConfig{Deployment: executor.Deployment{EnvelopeRetention: retention}, Lease: retention / 2})
	alice, refund := r.approvedRefund(t)
	done, err := alice.Resume(ctxT(t), refund.Approval.ID)
	if err != nil || done.Status != envelope.StatusCompleted {
		t.Fatalf("resume: %v %+v", err, done)
	}
	if got := r.statuses(t, "bob", audit.Query{})[done.ExecutionID]; got != string(envelope.StatusCompleted) {
		t.Fatalf("the resume is listed %q for its approver, want %q", got, envelope.StatusCompleted)
	}
	waitUntil(t, "the resume's envelope expires", func() bool {
		_, err := r.admin.Envelopes.Get(ctxT(t), broker.Key("alice", done.ExecutionID))
		return errors.Is(err, jetstream.ErrKeyNotFound)
	})
	for _, q := range []audit.Query{{}, {Status: audit.EntryRunning}} {
		if st, ok := r.statuses(t, "bob", q)[done.ExecutionID]; ok {
			t.Errorf("listing (status %q): the resume whose envelope expired is listed %q", q.Status, st)
		}
	}
	if _, ok := r.statuses(t, "bob", audit.Query{})[refund.ExecutionID]; !ok {
		t.Errorf("the execution that asked for the approval is no longer listed")
	}
}

// Each role reads what it needs and nothing more, enforced by the workers
// with the principal of the subject: a producer its own executions, with
// their trails and results; an approver the executions behind the approvals
// it may decide, with the input as approvers see it; an admin everything.
// Asking as someone else in the body changes nothing.
func TestReading_EachRoleSeesWhatItNeedsAndNoMore(t *testing.T) {
	t.Parallel()
	r := newReaders(t)
	alice := r.client(t, "alice", envelope.Actor{Kind: "user", ID: "alice"})
	gw := r.client(t, "gw", envelope.Actor{Kind: "user", ID: "dave"})

	echo, err := alice.Call(ctxT(t), "demo.echo", map[string]any{"hello": "world"})
	if err != nil || echo.Status != envelope.StatusCompleted {
		t.Fatalf("echo: %v %+v", err, echo)
	}
	refund, err := alice.Call(ctxT(t), "orders.refund", map[string]any{"orderId": "o-1", "amount": 900})
	if err != nil || refund.Status != envelope.StatusApprovalRequired {
		t.Fatalf("refund: %v %+v", err, refund)
	}
	other, err := gw.Call(ctxT(t), "demo.echo", map[string]any{"secret": "of gw"})
	if err != nil || other.Status != envelope.StatusCompleted {
		t.Fatalf("gw's echo: %v %+v", err, other)
	}
	flushAudit(t)

	// Producers: their own, whatever the body asks.
	got, err := r.list(t, "alice", executor.ExecutionsRequest{})
	if err != nil || !slices.Equal(got, []string{refund.ExecutionID, echo.ExecutionID}) {
		t.Fatalf("alice lists %v (%v), want her two", got, err)
	}
	if _, err := r.list(t, "alice", executor.ExecutionsRequest{Query: audit.Query{Principal: "gw"}}); !errors.Is(err, executor.ErrNotAllowed) {
		t.Fatalf("alice listing gw's: %v, want ErrNotAllowed", err)
	}
	v, err := r.get(t, "alice", echo.ExecutionID)
	if err != nil || v.Envelope == nil || v.Envelope.Status != envelope.StatusCompleted || len(v.Trail) == 0 || v.Scope != executor.ScopeOwn {
		t.Fatalf("alice reads her echo: %v %+v", err, v)
	}
	if _, err := r.get(t, "alice", other.ExecutionID); !errors.Is(err, executor.ErrNoSuchExecution) {
		t.Fatalf("alice reading gw's execution: %v, want ErrNoSuchExecution (it is not hers)", err)
	}
	if _, err := requestExecution(ctxT(t), r.conns["alice"], r.admin.Names,
		executor.ExecutionRequest{ExecutionID: other.ExecutionID, Owner: "gw"}); !errors.Is(err, executor.ErrNotAllowed) {
		t.Fatalf("alice naming gw as the owner: %v, want ErrNotAllowed", err)
	}

	// Approvers: the executions behind approvals of their types.
	got, err = r.list(t, "bob", executor.ExecutionsRequest{})
	if err != nil || !slices.Equal(got, []string{refund.ExecutionID}) {
		t.Fatalf("bob lists %v (%v), want the refund only", got, err)
	}
	v, err = r.get(t, "bob", refund.ExecutionID)
	if err != nil {
		t.Fatalf("bob reads the refund behind his approval: %v", err)
	}
	if v.Envelope == nil || v.Envelope.Status != envelope.StatusApprovalRequired || len(v.Approvals) != 1 ||
		len(v.Approvals[0].Input) == 0 || len(v.Trail) == 0 || v.Scope != executor.ScopeApprovals {
		t.Fatalf("bob's view: %+v", v)
	}
	for _, id := range []string{echo.ExecutionID, other.ExecutionID} {
		if _, err := r.get(t, "bob", id); !errors.Is(err, executor.ErrNotAllowed) {
			t.Errorf("bob reading %s (no approval behind it): %v, want ErrNotAllowed", id, err)
		}
	}
	if got, err := r.list(t, "carol", executor.ExecutionsRequest{}); err != nil || len(got) != 0 {
		t.Fatalf("carol (security) lists %v (%v), want nothing", got, err)
	}
	if _, err := r.get(t, "carol", refund.ExecutionID); !errors.Is(err, executor.ErrNotAllowed) {
		t.Fatalf("carol reading a finance approval's execution: %v, want ErrNotAllowed", err)
	}

	// Once approved and resumed, the approver reads the resume and its outcome too.
	if _, err := approvalsrpc.Decide(ctxT(t), r.conns["bob"], r.admin.Names,
		approvalsrpc.DecideRequest{ApprovalID: refund.Approval.ID, Approve: true}); err != nil {
		t.Fatal(err)
	}
	done, err := alice.Resume(ctxT(t), refund.Approval.ID)
	if err != nil || done.Status != envelope.StatusCompleted {
		t.Fatalf("resume: %v %+v", err, done)
	}
	flushAudit(t)
	got, err = r.list(t, "bob", executor.ExecutionsRequest{})
	if err != nil || !slices.Contains(got, done.ExecutionID) || !slices.Contains(got, refund.ExecutionID) || len(got) != 2 {
		t.Fatalf("bob lists %v (%v), want the refund and its resume", got, err)
	}
	if v, err := r.get(t, "bob", done.ExecutionID); err != nil || v.Envelope == nil || v.Envelope.Status != envelope.StatusCompleted {
		t.Fatalf("bob reads the resume's outcome: %v %+v", err, v)
	}

	// Admins: everything, every principal's.
	page, err := audit.List(ctxT(t), r.admin.NC, r.admin.Names.Prefix(), audit.Query{})
	if err != nil || len(page.Entries) != 4 {
		t.Fatalf("the index holds %d entries (%v), want 4", len(page.Entries), err)
	}
}

// A producer cannot read through the workers what its credentials forbid
// it to ask: the server refuses, at once, a listing under another
// principal's subject.
func TestReading_AnotherPrincipalsSubjectIsRefusedByTheServer(t *testing.T) {
	t.Parallel()
	r := newReaders(t)
	nc := r.conns["alice"]
	errs := make(chan error, 1)
	nc.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err })
	_, err := nc.Request(r.admin.Names.ListExecutionsSubject("gw"), nil, 2e9)
	if err == nil {
		t.Fatal("alice's request on gw's listing subject was answered")
	}
	if perr := <-errs; !errors.Is(perr, nats.ErrPermissionViolation) {
		t.Fatalf("server said %v, want a permissions violation", perr)
	}
}

// An id nothing is stored for is told apart from one still queued: the
// probe reads the exec stream, then the record, then the envelope.
func TestProbe_UnknownIsToldApartFromQueued(t *testing.T) {
	t.Parallel()
	r := newReaders(t)
	id := envelope.NewExecutionID()
	v, err := requestExecution(ctxT(t), r.conns["alice"], r.admin.Names, executor.ExecutionRequest{ExecutionID: id, Probe: true})
	if err != nil || v.State != executor.ExecUnknown {
		t.Fatalf("probe of a new id: %v %+v, want unknown", err, v)
	}
	// A request to a capability no pool serves stays queued.
	msg := nats.NewMsg(r.admin.Names.ExecSubject("alice", "nobody.serves"))
	msg.Header.Set(nats.MsgIdHdr, id)
	req := envelope.Request{V: envelope.Version, ExecutionID: id, CapabilityID: "nobody.serves",
		Actor: envelope.Actor{Kind: "user", ID: "alice"}}
	b, _ := envelope.Marshal(&req)
	msg.Data = b
	if _, err := r.admin.JS.PublishMsg(ctxT(t), msg); err != nil {
		t.Fatal(err)
	}
	v, err = requestExecution(ctxT(t), r.conns["alice"], r.admin.Names, executor.ExecutionRequest{ExecutionID: id, Probe: true})
	if err != nil || v.State != executor.ExecQueued {
		t.Fatalf("probe of a queued id: %v %+v, want queued", err, v)
	}
	// An id made long before its request was stored is found all the same.
	old := envelope.NewExecutionID()
	u, _ := uuid.Parse(old)
	ms := uint64(time.Now().Add(-10 * time.Minute).UnixMilli())
	for i := range 6 {
		u[i] = byte(ms >> (40 - 8*i))
	}
	old = u.String()
	msg.Header.Set(nats.MsgIdHdr, old)
	req.ExecutionID = old
	b, _ = envelope.Marshal(&req)
	msg.Data = b
	if _, err := r.admin.JS.PublishMsg(ctxT(t), msg); err != nil {
		t.Fatal(err)
	}
	v, err = requestExecution(ctxT(t), r.conns["alice"], r.admin.Names, executor.ExecutionRequest{ExecutionID: old, Probe: true})
	if err != nil || v.State != executor.ExecQueued {
		t.Fatalf("probe of a queued id made ten minutes before: %v %+v, want queued", err, v)
	}
	// gw does not see alice's queued request.
	v, err = requestExecution(ctxT(t), r.conns["gw"], r.admin.Names, executor.ExecutionRequest{ExecutionID: id, Probe: true})
	if err != nil || v.State != executor.ExecUnknown {
		t.Fatalf("gw's probe of alice's id: %v %+v, want unknown", err, v)
	}
}

// requestExecutions asks the workers for a page as the connection's
// principal, as a Client's Executions does.
func requestExecutions(ctx context.Context, nc *nats.Conn, n broker.Names, req executor.ExecutionsRequest) (*executor.ExecutionsPage, error) {
	req.V = envelope.Version
	return execrpc.Ask[executor.ExecutionsPage](ctx, nc, n, n.ListExecutionsSubject, &req, "list executions")
}

// requestExecution asks the workers for one execution as the connection's
// principal, as a Client's Execution does.
func requestExecution(ctx context.Context, nc *nats.Conn, n broker.Names, req executor.ExecutionRequest) (*executor.ExecutionView, error) {
	req.V = envelope.Version
	return execrpc.Ask[executor.ExecutionView](ctx, nc, n, n.ExecutionSubject, &req, "read execution "+req.ExecutionID)
}

// An approver's program opens a Client on its own credentials, as a
// producer's does, and lists and decides through it what its types allow:
// bob (finance) sees and approves the refund, recorded as himself; carol
// (security) sees nothing, and her decision is answered as of an approval
// that does not exist, which changes nothing.
func TestApproverClient_ListsAndDecidesItsTypesOnly(t *testing.T) {
	t.Parallel()
	r := newReaders(t)
	alice := r.client(t, "alice", envelope.Actor{Kind: "user", ID: "alice"})
	refund, err := alice.Call(ctxT(t), "orders.refund", map[string]any{"orderId": "o-9", "amount": 900})
	if err != nil || refund.Status != envelope.StatusApprovalRequired {
		t.Fatalf("refund: %v %+v", err, refund)
	}
	approvalID := refund.Approval.ID
	bob := r.client(t, "bob", envelope.Actor{})
	carol := r.client(t, "carol", envelope.Actor{})

	if page, err := carol.ListApprovals(ctxT(t), approvals.ListRequest{}); err != nil || len(page.Records) != 0 {
		t.Fatalf("carol lists %+v (%v), want nothing of finance", page, err)
	}
	if _, err := carol.Decide(ctxT(t), approvalID, approvals.Verdict{Approve: true}); !errors.Is(err, approvals.ErrNotFound) {
		t.Fatalf("carol deciding a finance approval: %v, want ErrNotFound", err)
	}
	page, err := bob.ListApprovals(ctxT(t), approvals.ListRequest{})
	if err != nil || len(page.Records) != 1 || page.Records[0].ID != approvalID || page.Records[0].Status != approvals.StatusPending {
		t.Fatalf("bob lists %+v (%v), want the pending refund", page, err)
	}
	rec, err := bob.Decide(ctxT(t), approvalID, approvals.Verdict{Approve: true, Comment: "checked",
		Approver: envelope.Actor{Kind: "user", ID: "alice"}})
	if err != nil || rec.Status != approvals.StatusApproved || rec.Decision == nil || rec.Decision.Approver.ID != "bob" {
		t.Fatalf("bob's decision: %+v (%v), want approved by bob whatever the verdict names", rec, err)
	}
	if env, err := alice.Resume(ctxT(t), approvalID); err != nil || env.Status != envelope.StatusCompleted {
		t.Fatalf("resume: %v %+v", err, env)
	}
}
