package executor_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/execution"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/approvalstore"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/demo"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// An approval authorizes one execution for as long as the approval exists
// (DESIGN §7), whatever has expired around it. The windows are short and
// stated together: envelopes kept 3 s, records 1 s after their last write,
// approvals (and the exec stream's requests, and its duplicate window) 8 s
// after their last write. A resume under a caller-chosen id runs; once its
// envelope and record have expired, the same request sent again (under a
// message id the duplicate window does not know) finds the approval consumed
// under a record that is gone: refused APPROVAL_CONSUMED, audited, the handler
// not called again — and so under any other id. Once the approval itself is
// gone, a request naming it is refused as naming no approval.
func TestApproval_ConsumedNeverRunsAgainAfterItsWindowsExpire(t *testing.T) {
	t.Parallel()
	cfg := broker.Config{EnvelopeRetention: 3 * time.Second, RecordWindow: time.Second, RecordTTL: 8 * time.Second}
	env := testenv.Start(t)
	s := newStoreWith(t, env, cfg, executor.ClientConfig{})
	nc := env.Connect(t)
	js, err := demo.Provision(ctxT(t), nc, 1)
	if err != nil {
		t.Fatal(err)
	}
	startWorker(t, nc, executor.WorkerConfig{Deployment: executor.Deployment(cfg), Lease: time.Second}, demo.Catalog(js)...)
	input := map[string]any{"orderId": "o1", "amount": 900}
	_, rec := requireApproval(t, s.c, "orders.refund", input, executor.As(alice))
	decide(t, s.c, rec.ID, true)
	const id = "refund-42"
	done, err := s.c.Resume(ctxT(t), rec.ID, executor.WithID(id))
	if err != nil || done.Status != envelope.StatusCompleted {
		t.Fatalf("resume: %v %+v", err, done)
	}
	calls := func() int {
		t.Helper()
		c, err := demo.ReadCalls(ctxT(t), js)
		if err != nil {
			t.Fatal(err)
		}
		return len(c)
	}
	if n := calls(); n != 1 {
		t.Fatalf("handler called %d times by the resume", n)
	}
	consumed, err := s.c.Approval(ctxT(t), rec.ID)
	if err != nil || consumed.Status != approvals.StatusConsumed || consumed.ConsumedBy != id || consumed.ConsumedUnder.IsZero() {
		t.Fatalf("approval after the resume: %v %+v", err, consumed)
	}
	s.waitRecordGone(id)
	waitUntil(t, "the envelope expired", func() bool {
		_, _, err := broker.Load[envelope.Envelope](ctxT(t), s.b.Envelopes, broker.Key(broker.Anonymous, id))
		return err == broker.ErrNotFound
	})

	resend := func(executionID, msgID string) *envelope.Envelope {
		t.Helper()
		req := &envelope.Request{V: envelope.Version, ExecutionID: executionID, CapabilityID: "orders.refund", ApprovalID: rec.ID,
			Input: envelope.MustRaw(input), Actor: alice, Surface: string(executor.SurfaceDirect), SubmittedAt: time.Now().UTC()}
		data, err := envelope.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		m := nats.NewMsg(s.b.Names.ExecSubject(broker.Anonymous, "orders.refund"))
		m.Data = data
		m.Header.Set(jetstream.MsgIDHeader, msgID)
		if _, err := s.b.JS.PublishMsg(ctxT(t), m); err != nil {
			t.Fatal(err)
		}
		return s.await(executionID)
	}
	for _, try := range []struct{ id, msgID string }{
		{id, broker.Key(broker.Anonymous, id) + ".again"}, // the same request, past its windows
		{"refund-43", "refund-43"},                        // another id naming the spent approval
	} {
		got := resend(try.id, try.msgID)
		mustFailWith(t, got, envelope.CodeApprovalConsumed)
		if m := got.ForModel(); m.Code != envelope.CodeApprovalConsumed || m.Message == "" {
			t.Errorf("%s: the model is told %+v", try.id, m)
		}
		ev, ok := find(s.settled(try.id), audit.EventDenied)
		if !ok || field(ev, "publicCode") != string(envelope.CodeApprovalConsumed) {
			t.Errorf("%s: denial %v (found %v), want APPROVAL_CONSUMED on the trail", try.id, ev.Data, ok)
		}
		if try.id == id && field(ev, "reason") != "approval-used-before" {
			t.Errorf("%s: denied for %s, want approval-used-before", try.id, field(ev, "reason"))
		}
	}
	if n := calls(); n != 1 {
		t.Fatalf("handler called %d times, want the resume's once", n)
	}
	after, err := s.c.Approval(ctxT(t), rec.ID)
	if err != nil || after.ConsumedBy != id || !after.ConsumedAt.Equal(consumed.ConsumedAt) || !after.ConsumedUnder.Equal(consumed.ConsumedUnder) {
		t.Fatalf("the approval changed: %v %+v", err, after)
	}

	// The approval's own retention ends: nothing names it any more.
	waitUntil(t, "the approval expired from its bucket", func() bool {
		_, err := s.c.Approval(ctxT(t), rec.ID)
		return errors.Is(err, approvals.ErrNotFound)
	})
	for _, try := range []struct{ id, msgID string }{
		{id, broker.Key(broker.Anonymous, id) + ".once-more"},
		{"refund-44", "refund-44"},
	} {
		got := resend(try.id, try.msgID)
		mustFailWith(t, got, envelope.CodeForbidden)
		if got.Error.Message != "No such approval." {
			t.Errorf("%s: %q, want No such approval.", try.id, got.Error.Message)
		}
	}
	if n := calls(); n != 1 {
		t.Fatalf("handler called %d times after the approval expired, want the resume's once", n)
	}
}

// A takeover of the execution that consumed an approval, its record alive
// (the worker lost after it consumed, before the attempt started), still
// runs under it, exactly once.
func TestApproval_TakeoverUnderTheSameRecordStillRuns(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	s := newStore(t, env)
	nc := env.Connect(t)
	js, err := demo.Provision(ctxT(t), nc, 1)
	if err != nil {
		t.Fatal(err)
	}
	asking := runWorkerOn(t, env.Connect(t), executor.WorkerConfig{}, demo.Catalog(js)...)
	_, rec := requireApproval(t, s.c, "orders.refund", json.RawMessage(`{"orderId":"o9","amount":700}`), executor.As(alice))
	decide(t, s.c, rec.ID, true)
	asking.Stop()
	// A worker claimed the resume and consumed its approval, then was lost
	// before its attempt started: the record says claimed, the approval
	// consumed under it.
	const id = "resume-7"
	created := time.Now().UTC().Add(-time.Minute)
	s.putRecord(&execution.Record{ExecutionID: id, CapabilityID: "orders.refund", ApprovalID: rec.ID, State: execution.StateClaimed,
		Worker: deadWorker, Claim: "c-lost", LeaseUntil: pastLease(), CreatedAt: created})
	if _, err := approvalstore.NewStore(s.b.Approvals, nil).Consume(ctxT(t), rec.ID, id, created); err != nil {
		t.Fatal(err)
	}
	req := &envelope.Request{ExecutionID: id, CapabilityID: "orders.refund", ApprovalID: rec.ID,
		Input: envelope.MustRaw(map[string]any{"orderId": "o9", "amount": 700})}
	s.publishRequest(s.b.Names.ExecSubject(broker.Anonymous, "orders.refund"), req)
	startWorker(t, env.Connect(t), executor.WorkerConfig{ID: "live-worker"}, demo.Catalog(js)...)
	got := s.await(id)
	if got.Status != envelope.StatusCompleted {
		t.Fatalf("takeover of the resume: %s %+v", got.Status, got.Error)
	}
	c, err := demo.ReadCalls(ctxT(t), js)
	if err != nil || len(c) != 1 || c[0].ExecutionID != id {
		t.Fatalf("handler calls %v (%v), want one of %s", c, err, id)
	}
	if _, ok := find(s.settled(id), audit.EventTakenOver); !ok {
		t.Error("no takeover in the trail")
	}
}
