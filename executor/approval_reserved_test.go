package executor_test

import (
	"testing"
	"time"

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

// The other side of that rule: a resume's record, claimed, its approval
// consumed, its worker lost before the attempt started. A request under its
// id that resumes nothing (the same call, as it was first sent) takes it over
// from the top, where the call asks for an approval again: it never runs on
// the strength of the resume's approval, which stays the resume's.
func TestApproval_PlainRequestUnderAResumesClaimDoesNotRunOnItsApproval(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	s := newStore(t, env)
	js, err := demo.Provision(ctxT(t), env.Connect(t), 1)
	if err != nil {
		t.Fatal(err)
	}
	startWorker(t, env.Connect(t), executor.WorkerConfig{}, demo.Catalog(js)...)
	in := map[string]any{"orderId": "o1", "amount": 900}
	_, rec := requireApproval(t, s.c, "orders.refund", in, executor.As(alice))
	decide(t, s.c, rec.ID, true)
	input := envelope.MustRaw(in)
	hash, err := envelope.InputHash(input)
	if err != nil {
		t.Fatal(err)
	}
	id := envelope.NewExecutionID()
	created := time.Now().UTC().Add(-time.Minute)
	s.putRecord(&execution.Record{ExecutionID: id, CapabilityID: "orders.refund", ApprovalID: rec.ID,
		State: execution.StateClaimed, Worker: deadWorker, Claim: "c-lost", LeaseUntil: pastLease(), CreatedAt: created,
		Actor: alice.String(), Surface: string(executor.SurfaceDirect), InputHash: hash})
	if _, err := approvalstore.NewStore(s.b.Approvals, nil).Consume(ctxT(t), rec.ID, id, created); err != nil {
		t.Fatal(err)
	}
	s.publishRequest(s.b.Names.ExecSubject(broker.Anonymous, "orders.refund"),
		&envelope.Request{ExecutionID: id, CapabilityID: "orders.refund", Input: input})
	got := s.await(id)
	if got.Status == envelope.StatusCompleted || got.Attempts != 0 {
		t.Fatalf("envelope %s, %d attempts (error %+v): ran without its approval", got.Status, got.Attempts, got.Error)
	}
	if calls, err := demo.ReadCalls(ctxT(t), js); err != nil || len(calls) != 0 {
		t.Fatalf("handler called %d times (%v), want none", len(calls), err)
	}
	after, err := s.c.Approval(ctxT(t), rec.ID)
	if err != nil || after.Status != approvals.StatusConsumed || after.ConsumedBy != id {
		t.Fatalf("approval after: %v %+v", err, after)
	}
}
