package executor_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/auth"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/natsserver"
)

type Payout struct {
	Vendor string `json:"vendor"`
	Amount int    `json:"amount"`
}

// A capability that requires approval does not run when called: the call
// ends approval-required, with a pending approval holding the validated
// input. Another principal decides it: here alice's agent asks, and carol, an
// approver, decides through the workers, which record her authenticated
// identity (neither can do the other's part: the server lets alice send no
// decision and carol no request). Client.Resume then runs the approved call
// once, as a new execution, as the original actor. A second resume finds the
// approval used.
func ExampleClient_Resume() {
	ctx := context.Background()
	connect, cleanup := exampleSecured(
		auth.Grant{Principal: "alice", Role: auth.RoleProducer, Actors: []string{"user:alice"}, Capabilities: []string{"finance.*"}},
		auth.Grant{Principal: "carol", Role: auth.RoleApprover, Actors: []string{"user:carol"}, Types: []string{"*"}},
	)
	defer cleanup()

	payout := executor.Define("finance.payout", executor.Meta{
		Description: "Pays a vendor.",
		Expose:      executor.On(executor.SurfaceDirect),
		SideEffect:  executor.SideEffectExternal,
		Risk:        executor.RiskHigh,
		Approval:    &executor.ApprovalRule{Required: true, Reason: "payouts need a second pair of eyes"},
	}, func(ctx context.Context, call executor.Call[Payout]) (string, error) {
		return fmt.Sprintf("paid %d to %s, approved by %s", call.Input.Amount, call.Input.Vendor, call.Approval.Approver), nil
	})
	stop := exampleWorker(connect(auth.WorkerPrincipal), executor.WorkerConfig{}, payout)
	defer stop()
	alice, err := executor.NewClient(connect("alice"), executor.ClientConfig{Actor: exampleAlice})
	check(err)
	defer alice.Close()

	env, err := alice.Call(ctx, "finance.payout", Payout{Vendor: "acme", Amount: 900})
	check(err)
	fmt.Println(env.Status, env.Approval.Reasons)
	approvalID := env.Approval.ID

	// carol, an approver, decides from her own connection, as capstan
	// approve does: the workers check that she may, and record her as the
	// approver.
	carol, err := executor.NewClient(connect("carol"), executor.ClientConfig{})
	check(err)
	defer carol.Close()
	decided, err := carol.Decide(ctx, approvalID, approvals.Verdict{Approve: true, Comment: "invoice checked"})
	check(err)
	fmt.Println(decided.Status, "by", decided.Decision.Approver)

	env, err = alice.Resume(ctx, approvalID)
	check(err)
	var out string
	check(env.Output.Decode(&out))
	fmt.Println(env.Status+":", out)

	env, err = alice.Resume(ctx, approvalID)
	check(err)
	fmt.Println(env.Status, env.Error.Code)
	// Output:
	// approval-required [payouts need a second pair of eyes]
	// approved by user:carol
	// completed: paid 900 to acme, approved by user:carol
	// failed APPROVAL_CONSUMED
}

// exampleSecured starts a server with authentication holding the principals
// of grants (and an admin and a worker), provisions its resources and
// publishes the accounts and the grants, as `capstan auth init`, `capstan
// auth add` and `capstan server --auth` do. connect connects as one principal.
func exampleSecured(grants ...auth.Grant) (connect func(principal string) *nats.Conn, cleanup func()) {
	dir, err := os.MkdirTemp("", "capstan-example-")
	check(err)
	setup, err := auth.Init(dir+"/secrets", "")
	check(err)
	for _, g := range grants {
		check(setup.Add(g))
	}
	s, err := natsserver.Start(natsserver.Options{StoreDir: dir + "/store", Port: -1,
		ConfigFile: setup.ServerConfigPath(), ResolverDir: dir + "/store/jwt"})
	check(err)
	url := natsserver.ClientURL(s)
	var conns []*nats.Conn
	connect = func(principal string) *nats.Conn {
		nc, err := executor.Connect(executor.ConnectOptions{URL: url, Creds: setup.CredsPath(principal)})
		check(err)
		conns = append(conns, nc)
		return nc
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Every principal's account, pushed to the running server.
	_, err = auth.PushAccounts(ctx, connect(auth.PushUser), setup)
	check(err)
	b, err := broker.Provision(ctx, connect(auth.AdminPrincipal), broker.Config{})
	check(err)
	check(auth.PublishGrants(ctx, b.JS, setup, 0))
	return connect, func() {
		for _, nc := range conns {
			nc.Close()
		}
		s.Shutdown()
		s.WaitForShutdown()
		_ = os.RemoveAll(dir)
	}
}
