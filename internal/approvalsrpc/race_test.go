package approvalsrpc_test

import (
	"errors"
	"sync"
	"testing"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/auth"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/approvalsrpc"
	"github.com/capstan-dev/capstan/internal/broker"
)

// Two approvers of the same types, on their own connections, decide one
// approval at once through the workers, one approving and one rejecting,
// while the requester's withdrawal races them: exactly one decision holds,
// the record names its actor, and the requesting execution's trail holds
// that one. A withdrawal may also follow the approval it raced (an
// approved approval is withdrawn until it is used): then the record is
// the withdrawal, and the trail holds the approval, then the withdrawal.
func TestDecide_ApproveRejectAndWithdrawRacingOneOutcomeOneEvent(t *testing.T) {
	t.Parallel()
	env, s, b, _ := securedDecisions(t, auth.Grant{Principal: "erin", Role: auth.RoleApprover,
		Actors: []string{"user:erin"}, Types: []string{"finance"}})
	carol, erin := env.ConnectAs(t, "carol"), env.ConnectAs(t, "erin")
	n := broker.NewNames("")
	for round := 0; round < 10; round++ {
		r := pendingOf(t, s, "alice")
		var wg sync.WaitGroup
		errs := make([]error, 3)
		wg.Add(3)
		go func() {
			defer wg.Done()
			_, errs[0] = approvalsrpc.Decide(ctxT(t), carol, n, approvalsrpc.DecideRequest{ApprovalID: r.ID, Approve: true})
		}()
		go func() {
			defer wg.Done()
			_, errs[1] = approvalsrpc.Decide(ctxT(t), erin, n, approvalsrpc.DecideRequest{ApprovalID: r.ID})
		}()
		go func() {
			defer wg.Done()
			_, errs[2] = s.Cancel(ctxT(t), r.ID, alice, "withdrawn")
		}()
		wg.Wait()
		who := []envelope.Actor{{Kind: "user", ID: "carol"}, {Kind: "user", ID: "erin"}, alice}
		status := []approvals.Status{approvals.StatusApproved, approvals.StatusRejected, approvals.StatusCancelled}
		won, approvedFirst := -1, false
		for i, err := range errs {
			switch {
			case err == nil && won == 0 && i == 2:
				won, approvedFirst = 2, true
			case err == nil && won >= 0:
				t.Fatalf("round %d: %s and %s both held", round, who[won], who[i])
			case err == nil:
				won = i
			case !errors.Is(err, approvals.ErrAlreadyDecided) && !errors.Is(err, approvals.ErrRejected) &&
				!errors.Is(err, approvals.ErrCancelled):
				t.Fatalf("round %d: %s refused with %v", round, who[i], err)
			}
		}
		if won < 0 {
			t.Fatalf("round %d: nobody decided: %v", round, errs)
		}
		got, err := s.Get(ctxT(t), r.ID)
		if err != nil || got.Status != status[won] || got.Decision == nil || got.Decision.Approver.String() != who[won].String() {
			t.Fatalf("round %d: %s won, the record holds %+v (%v)", round, who[won], got, err)
		}
		evs, err := audit.Read(ctxT(t), b.NC, b.Names.Prefix(), "alice", r.RequestedBy)
		if err != nil {
			t.Fatal(err)
		}
		if approvedFirst {
			if len(evs) != 2 || evs[0].Actor != audit.ActorOf(who[0]) || evs[0].Data["approvalId"] != r.ID {
				t.Fatalf("round %d: approved, then withdrawn; the trail holds %d events: %+v", round, len(evs), evs)
			}
			evs = evs[1:]
		}
		if len(evs) != 1 || evs[0].Actor != audit.ActorOf(who[won]) || evs[0].Data["approvalId"] != r.ID {
			t.Fatalf("round %d: %s won; the trail holds %d events: %+v", round, who[won], len(evs), evs)
		}
	}
}
