package auth_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/auth"
	"github.com/capstan-dev/capstan/capstantest"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/approvalsrpc"
	"github.com/capstan-dev/capstan/internal/broker"
)

type Payout struct {
	IBAN   string `json:"iban"`
	Amount int    `json:"amount"`
}

// A capability that redacts what an approver is shown of its input
// (Meta.RedactApprovalInput) keeps the rest from the approver's principal:
// what the workers send an approver, listing or deciding, holds the shown
// input, not the whole of it.
func TestForge_ApproverReceivesOnlyTheRedactedInput(t *testing.T) {
	t.Parallel()
	r := newRig(t, false)
	ctx := testCtx(t)
	const secret = "DE89370400440532013000"
	payout := executor.Define("t.payout", executor.Meta{
		Description: "Pays out.", Expose: executor.On(executor.SurfaceDirect), SideEffect: executor.SideEffectExternal,
		Policies: []executor.Policy{{Name: "finance", Evaluate: func(ctx context.Context, p executor.PolicyRequest) (executor.Decision, error) {
			return executor.Decision{Stance: executor.StanceRequireApproval, Reason: "payouts need finance", ApprovalTypes: []string{"finance"}}, nil
		}}},
		RedactApprovalInput: func(in any) any {
			p := in.(*Payout)
			return Payout{IBAN: "****" + p.IBAN[len(p.IBAN)-4:], Amount: p.Amount}
		},
	}, func(ctx context.Context, c executor.Call[Payout]) (string, error) { return "paid", nil })
	reg, err := executor.NewRegistry(payout)
	if err != nil {
		t.Fatal(err)
	}
	capstantest.Worker(t, reg, capstantest.WithConn(r.connect(t, auth.WorkerPrincipal)),
		capstantest.WithConfig(executor.WorkerConfig{Pool: "payouts"}))

	alice, _, _ := r.client(t, "alice", executor.SurfaceDirect)
	env, err := alice.Call(ctx, "t.payout", Payout{IBAN: secret, Amount: 70})
	if err != nil || env.Status != envelope.StatusApprovalRequired {
		t.Fatalf("%v %+v", err, env)
	}
	carol := r.connect(t, "carol")
	n := broker.NewNames(r.setup.Prefix)

	// The listing, as the approver's own connection receives it.
	req, _ := envelope.Marshal(&approvals.ListRequest{V: envelope.Version, ID: env.Approval.ID})
	m, err := carol.RequestWithContext(ctx, n.ListApprovalsSubject("carol"), req)
	if err != nil {
		t.Fatal(err)
	}
	var list approvals.ListReply
	if err := envelope.Unmarshal(m.Data, &list); err != nil || len(list.Records) != 1 {
		t.Fatalf("listing %+v, %v", list, err)
	}
	if string(list.Records[0].Display) != `{"amount":70,"iban":"****3000"}` {
		t.Fatalf("shown %s", list.Records[0].Display)
	}
	if bytes.Contains(m.Data, []byte(secret)) {
		t.Errorf("the listing sent to approver carol holds the whole input: %s", list.Records[0].Input)
	}
	// The decision's answer.
	dec, _ := envelope.Marshal(&approvalsrpc.DecideRequest{V: envelope.Version, ApprovalID: env.Approval.ID, Approve: false})
	m, err = carol.RequestWithContext(ctx, n.DecideSubject("carol"), dec)
	if err != nil {
		t.Fatal(err)
	}
	var decided approvalsrpc.DecideReply
	if err := envelope.Unmarshal(m.Data, &decided); err != nil || decided.Error != "" {
		t.Fatalf("decision %+v, %v", decided, err)
	}
	if bytes.Contains(m.Data, []byte(secret)) {
		t.Errorf("the decision's answer sent to approver carol holds the whole input: %s", decided.Record.Input)
	}
}
