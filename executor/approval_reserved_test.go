package executor_test

import (
	"testing"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/execution"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/approvalstore"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/demo"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// A call that needs an approval reserves the approval's id on its record
// before it stores the approval, so that a takeover finds the same approval
// instead of asking twice (DESIGN §7). Its worker lost after the
// reservation, before the envelope (and before or after storing the
// approval), the call's own redelivery is the request the record was claimed
// for, not another one under its id: it takes the execution over and ends it
// approval-required, naming the reserved approval, the only one the call
// ever asked for. A record in that state is what the worker leaves: claimed,
// naming the call and the reserved id.
func TestApproval_CallLostWhileAskingEndsNamingItsOneApproval(t *testing.T) {
	t.Parallel()
	for _, stored := range []bool{false, true} {
		name := "ReservedOnly"
		if stored {
			name = "ApprovalStored"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			env := testenv.Start(t)
			s := newStore(t, env)
			js, err := demo.Provision(ctxT(t), env.Connect(t), 1)
			if err != nil {
				t.Fatal(err)
			}
			input := envelope.MustRaw(map[string]any{"orderId": "o1", "amount": 900})
			hash, err := envelope.InputHash(input)
			if err != nil {
				t.Fatal(err)
			}
			id, reserved := envelope.NewExecutionID(), envelope.NewExecutionID()
			s.putRecord(&execution.Record{ExecutionID: id, CapabilityID: "orders.refund", ApprovalID: reserved,
				State: execution.StateClaimed, Worker: deadWorker, Claim: "c-lost", LeaseUntil: pastLease(),
				Actor: alice.String(), Surface: string(executor.SurfaceDirect), InputHash: hash})
			store := approvalstore.NewStore(s.b.Approvals, nil)
			if stored {
				canon, h, err := approvalstore.Canonical(input)
				if err != nil {
					t.Fatal(err)
				}
				if err := store.Create(ctxT(t), &approvals.Record{ID: reserved, CapabilityID: "orders.refund",
					Surface: string(executor.SurfaceDirect), Actor: alice, Input: canon, InputHash: h, Types: []string{"finance"},
					RequestedBy: id, Principal: broker.Anonymous}); err != nil {
					t.Fatal(err)
				}
			}
			s.publishRequest(s.b.Names.ExecSubject(broker.Anonymous, "orders.refund"),
				&envelope.Request{ExecutionID: id, CapabilityID: "orders.refund", Input: input})
			startWorker(t, env.Connect(t), executor.WorkerConfig{ID: "live-worker"}, demo.Catalog(js)...)

			got := s.await(id)
			if got.Status != envelope.StatusApprovalRequired || got.Approval == nil || got.Approval.ID != reserved {
				t.Fatalf("envelope %s %+v (error %+v), want approval-required naming the reserved approval %s",
					got.Status, got.Approval, got.Error, reserved)
			}
			all, err := store.List(ctxT(t), approvalstore.Filter{})
			if err != nil {
				t.Fatal(err)
			}
			if len(all) != 1 || all[0].ID != reserved || all[0].RequestedBy != id || all[0].Status != approvals.StatusPending {
				t.Fatalf("approvals stored: %d, first %+v; want the reserved one alone, pending", len(all), all)
			}
			if calls, err := demo.ReadCalls(ctxT(t), js); err != nil || len(calls) != 0 {
				t.Fatalf("handler called %d times (%v), want none", len(calls), err)
			}
		})
	}
}
