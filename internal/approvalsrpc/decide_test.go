package approvalsrpc_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/auth"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/approvalsrpc"
	"github.com/capstan-dev/capstan/internal/approvalstore"
	"github.com/capstan-dev/capstan/internal/auditemit"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/grantwatch"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// securedDecisions starts a server with authentication, a worker connection
// serving decisions with the grants, and returns a pending approval that
// principal alice requested as user:alice, of type finance.
func securedDecisions(t *testing.T, extra ...auth.Grant) (*testenv.Env, *approvalstore.Store, *broker.Broker, *approvals.Record) {
	t.Helper()
	setup, err := auth.Init(t.TempDir(), "")
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range append([]auth.Grant{
		{Principal: "alice", Role: auth.RoleProducer, Actors: []string{"user:alice"}, Capabilities: []string{"*"}},
		{Principal: "carol", Role: auth.RoleApprover, Actors: []string{"user:carol"}, Types: []string{"finance"}},
		{Principal: "dave", Role: auth.RoleApprover, Actors: []string{"user:dave"}, Types: []string{"ops"}},
	}, extra...) {
		if err := setup.Add(g); err != nil {
			t.Fatal(err)
		}
	}
	env := testenv.Start(t, testenv.Auth(setup))
	admin, err := broker.Provision(ctxT(t), env.Connect(t), broker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := auth.PublishGrants(ctxT(t), admin.JS, setup, 1); err != nil {
		t.Fatal(err)
	}
	wnc := env.ConnectAs(t, auth.WorkerPrincipal)
	b, err := broker.Provision(ctxT(t), wnc, broker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	grants, err := grantwatch.Watch(ctxT(t), b.JS, b.Names)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(grants.Stop)
	s := approvalstore.NewStore(b.Approvals, auditemit.New(b.NC, auditemit.Options{Prefix: b.Names.Prefix(), Audit: b.Audit, Index: b.Index}))
	sub, err := approvalsrpc.Serve(wnc, s, b.Names, grants)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	list, err := approvalsrpc.ServeList(wnc, s, nil, b.Names, grants)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = list.Unsubscribe() })
	r := pendingOf(t, s, "alice")
	return env, s, b, r
}

func pendingOf(t *testing.T, s *approvalstore.Store, principal string) *approvals.Record {
	t.Helper()
	input, hash, err := approvalstore.Canonical(envelope.MustRaw(map[string]any{"orderId": "o1", "amount": 900}))
	if err != nil {
		t.Fatal(err)
	}
	r := &approvals.Record{
		ID: envelope.NewExecutionID(), CapabilityID: "orders.refund", Surface: "direct", Actor: alice,
		Input: input, InputHash: hash, Types: []string{"finance"}, RequestedBy: envelope.NewExecutionID(),
		Principal: principal,
	}
	if err := s.Create(ctxT(t), r); err != nil {
		t.Fatal(err)
	}
	return r
}

func TestDecide_ApproverIsThePrincipalNeverTheRequest(t *testing.T) {
	t.Parallel()
	env, s, _, r := securedDecisions(t)
	carol := env.ConnectAs(t, "carol")
	// The request names someone else: the record names carol's identity.
	got, err := approvalsrpc.Decide(ctxT(t), carol, broker.NewNames(""), approvalsrpc.DecideRequest{
		ApprovalID: r.ID, Approve: true, Approver: envelope.Actor{Kind: "user", ID: "ceo"}, SelfApproval: "urgent"})
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != approvals.StatusApproved || got.Decision.Approver.String() != "user:carol" {
		t.Fatalf("decision %+v", got.Decision)
	}
	stored, err := s.Get(ctxT(t), r.ID)
	if err != nil || stored.Decision.Approver.ID != "carol" || stored.Decision.SelfApproval != "" {
		t.Fatalf("stored %+v, %v", stored, err)
	}
}

// An approver of other types is refused a decision exactly as if the
// approval did not exist: the refusal tells it neither that the approval
// exists nor its types.
func TestDecide_ApproverOfOtherTypesIsToldNoSuchApproval(t *testing.T) {
	t.Parallel()
	env, s, _, r := securedDecisions(t)
	dave := env.ConnectAs(t, "dave")
	decide := func(id string) error {
		_, err := approvalsrpc.Decide(ctxT(t), dave, broker.NewNames(""), approvalsrpc.DecideRequest{ApprovalID: id, Approve: true})
		return err
	}
	assertLikeNoSuchApproval(t, decide, r.ID, r.Types)
	assertPending(t, s, r.ID)
}

// assertLikeNoSuchApproval checks that ask refuses id exactly as it
// refuses an id no approval has — the same conditions, the same words but
// the id — and that nothing of the approval (its types) shows.
func assertLikeNoSuchApproval(t *testing.T, ask func(id string) error, id string, types []string) {
	t.Helper()
	none := envelope.NewExecutionID()
	got, want := ask(id), ask(none)
	if !errors.Is(got, approvals.ErrNotFound) || errors.Is(got, approvals.ErrForbidden) || !errors.Is(want, approvals.ErrNotFound) {
		t.Fatalf("refused %v, an id of nothing %v: want both ErrNotFound alone", got, want)
	}
	if g, w := strings.ReplaceAll(got.Error(), id, "ID"), strings.ReplaceAll(want.Error(), none, "ID"); g != w {
		t.Errorf("refusal %q differs from no such approval's %q", g, w)
	}
	for _, typ := range types {
		if strings.Contains(got.Error(), typ) {
			t.Errorf("refusal %q names the approval's type %s", got, typ)
		}
	}
}

func TestDecide_SelfApprovalJudgedOnAuthenticatedIdentity(t *testing.T) {
	t.Parallel()
	// An approver principal whose identity is the requester's actor.
	env, s, _, r := securedDecisions(t, auth.Grant{Principal: "alice-approver", Role: auth.RoleApprover,
		Actors: []string{"user:alice"}, Types: []string{"*"}})
	_, err := approvalsrpc.Decide(ctxT(t), env.ConnectAs(t, "alice-approver"), broker.NewNames(""),
		approvalsrpc.DecideRequest{ApprovalID: r.ID, Approve: true, SelfApproval: "I insist"})
	if !errors.Is(err, approvals.ErrSelfApproval) {
		t.Fatalf("err %v, want ErrSelfApproval", err)
	}
	// The admin may decide any type, but not what it requested itself.
	mine := pendingOf(t, s, auth.AdminPrincipal)
	_, err = approvalsrpc.Decide(ctxT(t), env.Connect(t), broker.NewNames(""),
		approvalsrpc.DecideRequest{ApprovalID: mine.ID, Approve: true})
	if !errors.Is(err, approvals.ErrSelfApproval) {
		t.Fatalf("admin on its own request: err %v, want ErrSelfApproval", err)
	}
	assertPending(t, s, r.ID)
	assertPending(t, s, mine.ID)
}

func assertPending(t *testing.T, s *approvalstore.Store, id string) {
	t.Helper()
	got, err := s.Get(ctxT(t), id)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != approvals.StatusPending || got.Decision != nil {
		t.Fatalf("approval %s is %s (%+v), want pending and undecided", id, got.Status, got.Decision)
	}
}

func TestList_AnApproverSeesTheApprovalsOfItsTypesOnly(t *testing.T) {
	t.Parallel()
	env, _, _, r := securedDecisions(t)
	n := broker.NewNames("")
	got, err := approvalsrpc.List(ctxT(t), env.ConnectAs(t, "carol"), n, approvals.ListRequest{})
	if err != nil || len(got.Records) != 1 || got.Records[0].ID != r.ID {
		t.Fatalf("carol (finance) lists %+v, %v", got, err)
	}
	got, err = approvalsrpc.List(ctxT(t), env.ConnectAs(t, "dave"), n, approvals.ListRequest{})
	if err != nil || len(got.Records) != 0 {
		t.Fatalf("dave (ops) lists %+v, %v", got, err)
	}
	dave := env.ConnectAs(t, "dave")
	assertLikeNoSuchApproval(t, func(id string) error {
		_, err := approvalsrpc.List(ctxT(t), dave, n, approvals.ListRequest{ID: id})
		return err
	}, r.ID, r.Types)
}

func TestList_AProducerSeesOnlyTheApprovalsItRequested(t *testing.T) {
	t.Parallel()
	env, s, _, r := securedDecisions(t, auth.Grant{Principal: "bob", Role: auth.RoleProducer,
		Actors: []string{"user:bob"}, Capabilities: []string{"*"}})
	other := pendingOf(t, s, "bob")
	n := broker.NewNames("")
	alice := env.ConnectAs(t, "alice")
	got, err := approvalsrpc.List(ctxT(t), alice, n, approvals.ListRequest{})
	if err != nil || len(got.Records) != 1 || got.Records[0].ID != r.ID {
		t.Fatalf("alice lists %+v, %v; want her own approval only", got, err)
	}
	one, err := approvalsrpc.One(ctxT(t), alice, n, r.ID)
	if err != nil || one.ID != r.ID {
		t.Fatalf("alice shows her own approval: %+v, %v", one, err)
	}
	assertLikeNoSuchApproval(t, func(id string) error {
		_, err := approvalsrpc.List(ctxT(t), alice, n, approvals.ListRequest{ID: id})
		return err
	}, other.ID, other.Types)
	assertPending(t, s, other.ID)
	assertPending(t, s, r.ID)
}
