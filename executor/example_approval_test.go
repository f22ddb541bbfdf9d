package executor_test

import (
	"context"
	"fmt"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/executor"
)

type Payout struct {
	Vendor string `json:"vendor"`
	Amount int    `json:"amount"`
}

// A capability that requires approval does not run when called: the call
// ends approval-required, with a pending approval holding the validated
// input. Someone other than the requester decides it (approvals.Store, or
// `capstan approvals approve`); Client.Resume then runs the approved call
// once, as a new execution, as the original actor. A second resume finds the
// approval used.
func ExampleClient_Resume() {
	nc, cleanup := exampleConn()
	defer cleanup()
	ctx := context.Background()

	payout := executor.Define("finance.payout", executor.Meta{
		Description: "Pays a vendor.",
		Expose:      executor.On(executor.SurfaceDirect),
		SideEffect:  executor.External,
		Risk:        executor.RiskHigh,
		Approval:    &executor.ApprovalRule{Required: true, Reason: "payouts need a second pair of eyes"},
	}, func(ctx context.Context, call executor.Call[Payout]) (string, error) {
		return fmt.Sprintf("paid %d to %s, approved by %s", call.Input.Amount, call.Input.Vendor, call.Approval.Approver), nil
	})
	stop := exampleWorker(nc, executor.WorkerConfig{}, payout)
	defer stop()
	c := exampleClient(nc)
	defer c.Close()

	env, err := c.Call(ctx, "finance.payout", Payout{Vendor: "acme", Amount: 900}, executor.As(exampleAlice))
	check(err)
	fmt.Println(env.Status, env.Approval.Reasons)
	approvalID := env.Approval.ID

	store := c.Approvals()
	pending, err := store.Get(ctx, approvalID)
	check(err)
	fmt.Println(pending.Status, "for", pending.Actor, string(pending.Input))
	_, err = store.Decide(ctx, approvalID, approvals.Verdict{Approve: true, Approver: exampleBob, Comment: "invoice checked"})
	check(err)

	env, err = c.Resume(ctx, approvalID)
	check(err)
	var out string
	check(env.Output.Decode(&out))
	fmt.Println(env.Status+":", out)

	env, err = c.Resume(ctx, approvalID)
	check(err)
	fmt.Println(env.Status, env.Error.Code)
	// Output:
	// approval-required [payouts need a second pair of eyes]
	// pending for user:alice {"amount":900,"vendor":"acme"}
	// completed: paid 900 to acme, approved by user:bob
	// failed APPROVAL_CONSUMED
}
