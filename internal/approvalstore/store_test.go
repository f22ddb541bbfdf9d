package approvalstore_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/approvalstore"
	"github.com/capstan-dev/capstan/internal/auditemit"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/nats-io/nats.go"
)

var (
	alice = envelope.Actor{Kind: "user", ID: "alice"}
	bob   = envelope.Actor{Kind: "user", ID: "bob"}
	carol = envelope.Actor{Kind: "user", ID: "carol"}
)

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// storeOn provisions the resources on nc and returns a store auditing on them.
func storeOn(t *testing.T, nc *nats.Conn) (*approvalstore.Store, *broker.Broker) {
	t.Helper()
	b, err := broker.Provision(ctxT(t), nc, broker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return approvalstore.NewStore(b.Approvals, auditemit.New(b.NC, auditemit.Options{Prefix: b.Names.Prefix(), Audit: b.Audit, Index: b.Index})), b
}

// pending creates a pending approval for alice's refund of amount.
func pending(t *testing.T, s *approvalstore.Store, amount int) *approvals.Record {
	t.Helper()
	input, hash, err := approvalstore.Canonical(envelope.MustRaw(map[string]any{"orderId": "o1", "amount": amount}))
	if err != nil {
		t.Fatal(err)
	}
	r := &approvals.Record{
		ID: envelope.NewExecutionID(), CapabilityID: "orders.refund", Surface: "direct", Actor: alice,
		Input: input, InputHash: hash, Reasons: []string{"refunds above 500 need a finance approval"},
		Types: []string{"finance"}, Risk: "high", SideEffect: "write", RequestedBy: envelope.NewExecutionID(),
	}
	if err := s.Create(ctxT(t), r); err != nil {
		t.Fatal(err)
	}
	return r
}

func approve(t *testing.T, s *approvalstore.Store, id string) {
	t.Helper()
	if _, err := s.Decide(ctxT(t), id, approvals.Verdict{Approve: true, Approver: bob}); err != nil {
		t.Fatal(err)
	}
}

// rewrite changes a stored record behind the store's back, as anyone with
// write access to the bucket could.
func rewrite(t *testing.T, b *broker.Broker, id string, change func(r *approvals.Record)) {
	t.Helper()
	ctx := ctxT(t)
	r, rev, err := broker.Load[approvals.Record](ctx, b.Approvals, id)
	if err != nil {
		t.Fatal(err)
	}
	change(r)
	if _, err := broker.Update(ctx, b.Approvals, id, r, rev); err != nil {
		t.Fatal(err)
	}
}

func TestCanonical_SortedKeysNoWhitespace(t *testing.T) {
	t.Parallel()
	raw, err := envelope.RawFromJSON([]byte(`{ "b": 1, "a": [ 2.5, "x" ], "c": {"z": null, "y": true} }`))
	if err != nil {
		t.Fatal(err)
	}
	got, hash, err := approvalstore.Canonical(raw)
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"a":[2.5,"x"],"b":1,"c":{"y":true,"z":null}}`; string(got) != want {
		t.Fatalf("canonical %s, want %s", got, want)
	}
	if want, _ := envelope.InputHash(raw); hash != want {
		t.Fatalf("hash %s, want envelope.InputHash %s", hash, want)
	}
}

func TestCanonical_UnserializableInputRefused(t *testing.T) {
	t.Parallel()
	for name, v := range map[string]any{
		"NaN":      map[string]any{"amount": math.NaN()},
		"Inf":      map[string]any{"amount": math.Inf(1)},
		"bytes":    map[string]any{"blob": []byte{1, 2}},
		"bad UTF8": map[string]any{"name": "\xff"},
	} {
		t.Run(name, func(t *testing.T) {
			_, _, err := approvalstore.Canonical(envelope.MustRaw(v))
			if !errors.Is(err, approvals.ErrUnserializableInput) {
				t.Fatalf("err %v, want ErrUnserializableInput", err)
			}
			if c := approvalstore.Code(err); c != envelope.CodeApprovalUnserializableInput {
				t.Fatalf("code %s", c)
			}
		})
	}
}

func TestCreate_RecordRoundTripsAsPending(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	s, _ := storeOn(t, env.Connect(t))
	r := pending(t, s, 900)

	got, err := s.Get(ctxT(t), r.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.V != envelope.Version || got.Status != approvals.StatusPending || got.Decision != nil || got.ConsumedBy != "" {
		t.Fatalf("record %+v", got)
	}
	if string(got.Input) != `{"amount":900,"orderId":"o1"}` || got.InputHash != r.InputHash {
		t.Fatalf("input %s hash %s", got.Input, got.InputHash)
	}
	if ttl := got.ExpiresAt.Sub(got.RequestedAt); ttl != approvalstore.DefaultTTL {
		t.Fatalf("expires %v after the request, want %v", ttl, approvalstore.DefaultTTL)
	}
	if got.Actor.String() != alice.String() || got.RequestedBy != r.RequestedBy || len(got.Reasons) != 1 || got.Types[0] != "finance" {
		t.Fatalf("record %+v", got)
	}
	if _, err := s.Get(ctxT(t), envelope.NewExecutionID()); !errors.Is(err, approvals.ErrNotFound) {
		t.Fatalf("get unknown: %v", err)
	}
}

// An approval, once created, is never replaced: a create under its id by
// another request is refused and leaves it as it was (an approved record
// stays approved); the same request's create again, as after a lost answer,
// succeeds without writing.
func TestCreate_ExistingApprovalNeverReplaced(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	s, b := storeOn(t, env.Connect(t))
	r := pending(t, s, 900)
	approve(t, s, r.ID)
	ctx := ctxT(t)
	_, before, err := broker.Load[approvals.Record](ctx, b.Approvals, r.ID)
	if err != nil {
		t.Fatal(err)
	}

	again := *r
	again.Status, again.Decision = "", nil
	if err := s.Create(ctx, &again); err != nil {
		t.Fatalf("the same request's create again: %v", err)
	}
	other := *r
	other.Status, other.Decision = "", nil
	other.RequestedBy = envelope.NewExecutionID()
	if err := s.Create(ctx, &other); !errors.Is(err, broker.ErrExists) {
		t.Fatalf("another request's create under the id: %v, want broker.ErrExists", err)
	}
	got, after, err := broker.Load[approvals.Record](ctx, b.Approvals, r.ID)
	if err != nil {
		t.Fatal(err)
	}
	if after != before || got.Status != approvals.StatusApproved || got.RequestedBy != r.RequestedBy {
		t.Fatalf("the approval changed: revision %d → %d, %s requested by %s", before, after, got.Status, got.RequestedBy)
	}
}

func TestCreate_InputNotMatchingItsHashRefused(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	s, _ := storeOn(t, env.Connect(t))
	input, _, _ := approvalstore.Canonical(envelope.MustRaw(map[string]any{"amount": 900}))
	_, other, _ := approvalstore.Canonical(envelope.MustRaw(map[string]any{"amount": 1}))
	err := s.Create(ctxT(t), &approvals.Record{ID: envelope.NewExecutionID(), CapabilityID: "orders.refund",
		Actor: alice, Input: input, InputHash: other, RequestedBy: envelope.NewExecutionID()})
	if !errors.Is(err, approvals.ErrInputMismatch) {
		t.Fatalf("err %v, want ErrInputMismatch", err)
	}
}

func TestDecide_RequesterCannotApproveOwnCall(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	s, _ := storeOn(t, env.Connect(t))
	r := pending(t, s, 900)
	ctx := ctxT(t)

	_, err := s.Decide(ctx, r.ID, approvals.Verdict{Approve: true, Approver: alice})
	if !errors.Is(err, approvals.ErrSelfApproval) || approvalstore.Code(err) != envelope.CodeApprovalSelfApproval {
		t.Fatalf("err %v, want ErrSelfApproval", err)
	}
	if got, _ := s.Get(ctx, r.ID); got.Status != approvals.StatusPending {
		t.Fatalf("status %s after a refused self-approval", got.Status)
	}
	// Explicitly allowed, with a reason that stays on the record.
	got, err := s.Decide(ctx, r.ID, approvals.Verdict{Approve: true, Approver: alice, SelfApproval: "on call alone tonight"})
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != approvals.StatusApproved || got.Decision.SelfApproval != "on call alone tonight" || got.Decision.Approver.String() != alice.String() {
		t.Fatalf("record %+v decision %+v", got, got.Decision)
	}
}

func TestDecide_OnlyFromPending(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	s, _ := storeOn(t, env.Connect(t))
	ctx := ctxT(t)

	r := pending(t, s, 900)
	approve(t, s, r.ID)
	_, err := s.Decide(ctx, r.ID, approvals.Verdict{Approve: false, Approver: carol})
	if !errors.Is(err, approvals.ErrAlreadyDecided) {
		t.Fatalf("reject after approve: %v", err)
	}
	if got, _ := s.Get(ctx, r.ID); got.Status != approvals.StatusApproved || got.Decision.Approver.String() != bob.String() {
		t.Fatalf("record %+v", got)
	}
	if _, err := s.Consume(ctx, r.ID, envelope.NewExecutionID(), time.Now()); err != nil {
		t.Fatal(err)
	}
	_, err = s.Decide(ctx, r.ID, approvals.Verdict{Approve: true, Approver: carol})
	if !errors.Is(err, approvals.ErrAlreadyDecided) || approvalstore.Code(err) != envelope.CodeApprovalConsumed {
		t.Fatalf("approve after consume: %v (code %s)", err, approvalstore.Code(err))
	}

	rejected := pending(t, s, 900)
	if _, err := s.Decide(ctx, rejected.ID, approvals.Verdict{Approver: bob, Comment: "no"}); err != nil {
		t.Fatal(err)
	}
	_, err = s.Decide(ctx, rejected.ID, approvals.Verdict{Approve: true, Approver: carol})
	if approvalstore.Code(err) != envelope.CodeApprovalRejected {
		t.Fatalf("approve after reject: %v", err)
	}
}

func TestDecide_AnonymousApproverRefused(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	s, _ := storeOn(t, env.Connect(t))
	r := pending(t, s, 900)
	for _, a := range []envelope.Actor{{}, {Kind: "anonymous"}, {Kind: "user"}} {
		if _, err := s.Decide(ctxT(t), r.ID, approvals.Verdict{Approve: true, Approver: a}); !errors.Is(err, approvals.ErrInvalid) {
			t.Fatalf("approver %+v: %v", a, err)
		}
	}
}

func TestDecide_PastExpiryRefusedAndMarkedExpired(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	s, b := storeOn(t, env.Connect(t))
	r := pending(t, s, 900)
	rewrite(t, b, r.ID, func(r *approvals.Record) { r.ExpiresAt = time.Now().Add(-time.Second) })

	got, err := s.Decide(ctxT(t), r.ID, approvals.Verdict{Approve: true, Approver: bob})
	if !errors.Is(err, approvals.ErrExpired) || approvalstore.Code(err) != envelope.CodeApprovalExpired {
		t.Fatalf("err %v, want ErrExpired", err)
	}
	if got.Status != approvals.StatusExpired || got.Decision != nil {
		t.Fatalf("record %+v", got)
	}
}

// However many approvers race, one decision is recorded.
func TestDecide_ConcurrentDecisionsOneWins(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	s, _ := storeOn(t, env.Connect(t))
	r := pending(t, s, 900)

	var wg sync.WaitGroup
	errs := make([]error, 20)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v := approvals.Verdict{Approve: i%2 == 0, Approver: envelope.Actor{Kind: "user", ID: fmt.Sprintf("approver%d", i)}}
			_, errs[i] = s.Decide(context.Background(), r.ID, v)
		}()
	}
	wg.Wait()
	won := -1
	for i, err := range errs {
		switch {
		case err == nil && won >= 0:
			t.Fatalf("decisions %d and %d both succeeded", won, i)
		case err == nil:
			won = i
		case !errors.Is(err, approvals.ErrAlreadyDecided):
			t.Fatalf("decision %d: %v", i, err)
		}
	}
	got, _ := s.Get(ctxT(t), r.ID)
	if won < 0 || got.Decision.Approver.ID != fmt.Sprintf("approver%d", won) {
		t.Fatalf("winner %d, record decision %+v", won, got.Decision)
	}
}

// Consumption is one CAS in the shared bucket: stores on separate connections
// (workers, clients, CLIs) racing for one approval let exactly one through.
func TestConsume_ExactlyOnceAcrossConnections(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	stores := make([]*approvalstore.Store, 5)
	for i := range stores {
		stores[i], _ = storeOn(t, env.Connect(t))
	}
	for round := 0; round < 20; round++ {
		r := pending(t, stores[0], 900)
		approve(t, stores[0], r.ID)
		ids := make([]string, 50)
		errs := make([]error, len(ids))
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range ids {
			ids[i] = envelope.NewExecutionID()
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				_, errs[i] = stores[i%len(stores)].Consume(context.Background(), r.ID, ids[i], time.Now())
			}()
		}
		close(start)
		wg.Wait()
		winner := ""
		for i, err := range errs {
			switch {
			case err == nil && winner != "":
				t.Fatalf("round %d: %s and %s both consumed", round, winner, ids[i])
			case err == nil:
				winner = ids[i]
			case !errors.Is(err, approvals.ErrConsumed) || approvalstore.Code(err) != envelope.CodeApprovalConsumed:
				t.Fatalf("round %d: %v", round, err)
			}
		}
		got, _ := stores[1].Get(ctxT(t), r.ID)
		if winner == "" || got.Status != approvals.StatusConsumed || got.ConsumedBy != winner {
			t.Fatalf("round %d: winner %q, record %+v", round, winner, got)
		}
	}
}

// A takeover or redelivery of the execution that consumed an approval,
// holding the same execution record, finds it still covered; any other
// execution does not, and nor does the same id under a record made since
// (DESIGN §7: the approval's record is the proof of use).
func TestConsume_SameExecutionUnderTheSameRecordOnly(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	s, _ := storeOn(t, env.Connect(t))
	r := pending(t, s, 900)
	approve(t, s, r.ID)
	exec := envelope.NewExecutionID()
	ctx := ctxT(t)
	record := time.Now().UTC().Add(-time.Second)
	first, err := s.Consume(ctx, r.ID, exec, record)
	if err != nil {
		t.Fatal(err)
	}
	if !first.ConsumedUnder.Equal(record) {
		t.Fatalf("consumed under %v, want the record of %v", first.ConsumedUnder, record)
	}
	again, err := s.Consume(ctx, r.ID, exec, record)
	if err != nil {
		t.Fatalf("consume again by the same execution under its record: %v", err)
	}
	if !again.ConsumedAt.Equal(first.ConsumedAt) || again.ConsumedBy != exec {
		t.Fatalf("the second consume changed the record: %+v", again)
	}
	for name, try := range map[string]struct {
		id     string
		record time.Time
	}{
		"another execution":                   {envelope.NewExecutionID(), record},
		"the same id under a later record":    {exec, record.Add(time.Minute)},
		"the same id under an earlier record": {exec, record.Add(-time.Nanosecond)},
	} {
		if _, err := s.Consume(ctx, r.ID, try.id, try.record); !errors.Is(err, approvals.ErrConsumed) {
			t.Errorf("%s: %v, want ErrConsumed", name, err)
		}
	}
	if _, err := s.Consume(ctx, r.ID, exec, time.Time{}); !errors.Is(err, approvals.ErrInvalid) {
		t.Errorf("consumed under no record: %v, want ErrInvalid", err)
	}
	if got, _ := s.Get(ctx, r.ID); got.ConsumedBy != exec || !got.ConsumedUnder.Equal(record) || !got.ConsumedAt.Equal(first.ConsumedAt) {
		t.Errorf("the refusals changed the record: %+v", got)
	}
}

// An approval authorizes one execution: once consumed, it stays usable by that
// execution's record alone (its takeovers), never by another execution, by
// a check that names none, or by the same id under another record.
func TestUsable_ConsumedApprovalCoversOnlyItsExecution(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	s, _ := storeOn(t, env.Connect(t))
	r := pending(t, s, 900)
	approve(t, s, r.ID)
	exec := envelope.NewExecutionID()
	record := time.Now()
	consumed, err := s.Consume(ctxT(t), r.ID, exec, record)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	if err := approvalstore.Usable(consumed, exec, record, now); err != nil {
		t.Errorf("the execution that consumed it: %v, want usable", err)
	}
	if err := approvalstore.Usable(consumed, envelope.NewExecutionID(), record, now); !errors.Is(err, approvals.ErrConsumed) {
		t.Errorf("another execution: %v, want ErrConsumed", err)
	}
	if err := approvalstore.Usable(consumed, "", record, now); !errors.Is(err, approvals.ErrConsumed) {
		t.Errorf("no execution: %v, want ErrConsumed", err)
	}
	if err := approvalstore.Usable(consumed, exec, record.Add(time.Hour), now); !errors.Is(err, approvals.ErrConsumed) {
		t.Errorf("the same id under another record: %v, want ErrConsumed", err)
	}
	if err := approvalstore.Usable(consumed, exec, time.Time{}, now); !errors.Is(err, approvals.ErrConsumed) {
		t.Errorf("the same id under no record: %v, want ErrConsumed", err)
	}
	if err := approvalstore.Usable(consumed, exec, record, consumed.ExpiresAt.Add(time.Hour)); err != nil {
		t.Errorf("the execution that consumed it, past the expiry: %v, want usable (a consumed approval does not expire)", err)
	}
}

func TestConsume_RefusedUnlessApproved(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	s, b := storeOn(t, env.Connect(t))
	ctx := ctxT(t)
	cases := []struct {
		name  string
		setup func(r *approvals.Record)
		want  envelope.Code
	}{
		{"pending", func(*approvals.Record) {}, envelope.CodeApprovalPending},
		{"rejected", func(r *approvals.Record) {
			if _, err := s.Decide(ctx, r.ID, approvals.Verdict{Approver: bob}); err != nil {
				t.Fatal(err)
			}
		}, envelope.CodeApprovalRejected},
		{"cancelled", func(r *approvals.Record) {
			if _, err := s.Cancel(ctx, r.ID, alice, "changed my mind"); err != nil {
				t.Fatal(err)
			}
		}, envelope.CodeApprovalRejected},
		{"pending past expiry", func(r *approvals.Record) {
			rewrite(t, b, r.ID, func(r *approvals.Record) { r.ExpiresAt = time.Now().Add(-time.Second) })
		}, envelope.CodeApprovalExpired},
		{"approved past expiry", func(r *approvals.Record) {
			approve(t, s, r.ID)
			rewrite(t, b, r.ID, func(r *approvals.Record) { r.ExpiresAt = time.Now().Add(-time.Second) })
		}, envelope.CodeApprovalExpired},
		{"input changed in the bucket", func(r *approvals.Record) {
			approve(t, s, r.ID)
			rewrite(t, b, r.ID, func(r *approvals.Record) { r.Input = []byte(`{"amount":90000,"orderId":"o1"}`) })
		}, envelope.CodeApprovalInputMismatch},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := pending(t, s, 900)
			c.setup(r)
			_, err := s.Consume(ctx, r.ID, envelope.NewExecutionID(), time.Now())
			if code := approvalstore.Code(err); code != c.want {
				t.Fatalf("err %v (code %s), want %s", err, code, c.want)
			}
			if got, _ := s.Get(ctx, r.ID); got.Status == approvals.StatusConsumed {
				t.Fatalf("consumed after a refusal: %+v", got)
			}
		})
	}
}

func TestList_FiltersByStatusCapabilityAndActor(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	s, b := storeOn(t, env.Connect(t))
	ctx := ctxT(t)
	p := pending(t, s, 900)
	a := pending(t, s, 901)
	approve(t, s, a.ID)
	x := pending(t, s, 902)
	rewrite(t, b, x.ID, func(r *approvals.Record) { r.ExpiresAt = time.Now().Add(-time.Second) })
	input, hash, _ := approvalstore.Canonical(envelope.MustRaw(map[string]any{"to": "x@example.com"}))
	other := &approvals.Record{ID: envelope.NewExecutionID(), CapabilityID: "email.send", Actor: carol,
		Input: input, InputHash: hash, RequestedBy: envelope.NewExecutionID()}
	if err := s.Create(ctx, other); err != nil {
		t.Fatal(err)
	}

	ids := func(f approvalstore.Filter) []string {
		rs, err := s.List(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, r := range rs {
			out = append(out, r.ID)
		}
		return out
	}
	for name, c := range map[string]struct {
		f    approvalstore.Filter
		want []string
	}{
		"all":                      {approvalstore.Filter{}, []string{p.ID, a.ID, x.ID, other.ID}},
		"pending":                  {approvalstore.Filter{Status: approvals.StatusPending}, []string{p.ID, other.ID}},
		"approved":                 {approvalstore.Filter{Status: approvals.StatusApproved}, []string{a.ID}},
		"expired (not yet marked)": {approvalstore.Filter{Status: approvals.StatusExpired}, []string{x.ID}},
		"capability":               {approvalstore.Filter{CapabilityID: "email.send"}, []string{other.ID}},
		"actor":                    {approvalstore.Filter{Actor: alice}, []string{p.ID, a.ID, x.ID}},
		"actor and status":         {approvalstore.Filter{Actor: carol, Status: approvals.StatusApproved}, nil},
	} {
		if got := ids(c.f); fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("%s: %v, want %v", name, got, c.want)
		}
	}

	n, err := s.ExpireDue(ctx)
	if err != nil || n != 1 {
		t.Fatalf("ExpireDue: %d, %v", n, err)
	}
	if got, _ := s.Get(ctx, x.ID); got.Status != approvals.StatusExpired {
		t.Fatalf("status %s after ExpireDue", got.Status)
	}
}

// A decision lands in the requesting execution's trail, the approver acting.
func TestDecide_AuditedWithApproverAsActor(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	nc := env.Connect(t)
	s, b := storeOn(t, nc)
	approved := pending(t, s, 900)
	rejected := pending(t, s, 900)
	ctx := ctxT(t)
	if _, err := s.Decide(ctx, approved.ID, approvals.Verdict{Approve: true, Approver: bob, Comment: "ok"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Decide(ctx, rejected.ID, approvals.Verdict{Approver: carol}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		r     *approvals.Record
		typ   string
		actor envelope.Actor
	}{{approved, audit.EventApproved, bob}, {rejected, audit.EventRejected, carol}} {
		evs := trail(t, b, c.r.RequestedBy)
		if len(evs) != 1 {
			t.Fatalf("trail of %s: %+v", c.r.RequestedBy, evs)
		}
		ev := evs[0]
		if ev.Type != c.typ || ev.Actor != audit.ActorOf(c.actor) || ev.Data["approvalId"] != c.r.ID ||
			ev.Data["requester"] != "user:alice" || ev.InputHash != c.r.InputHash || ev.CapabilityID != "orders.refund" {
			t.Fatalf("event %+v", ev)
		}
	}
}

// trail reads every audit event of one execution. Decide stores its event
// before it returns.
func trail(t *testing.T, b *broker.Broker, executionID string) []audit.Event {
	t.Helper()
	evs, err := audit.Read(ctxT(t), b.NC, b.Names.Prefix(), broker.Anonymous, executionID)
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

// One approval that does not decode (an empty value, garbage) is that
// approval's problem alone: every listing skips it and tells OnSkipped, and
// lists, expires and decides the others.
func TestList_SkipsARecordThatDoesNotDecode(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	s, b := storeOn(t, testenv.Start(t).Connect(t))
	var mu sync.Mutex
	var skipped []string
	s.OnSkipped(func(key string, err error) {
		mu.Lock()
		defer mu.Unlock()
		if !errors.Is(err, envelope.ErrDecode) {
			t.Errorf("skipped %s for %v, want a decoding error", key, err)
		}
		skipped = append(skipped, key)
	})
	good := pending(t, s, 900)
	empty, garbage := envelope.NewExecutionID(), envelope.NewExecutionID()
	if _, err := b.Approvals.Put(ctx, empty, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Approvals.Put(ctx, garbage, []byte{0xc1, 0xc1}); err != nil {
		t.Fatal(err)
	}
	list, err := s.List(ctx, approvalstore.Filter{})
	if err != nil || len(list) != 1 || list[0].ID != good.ID {
		t.Fatalf("list: %v %+v", err, list)
	}
	if _, err := s.ExpireDue(ctx); err != nil {
		t.Fatalf("expiring with a record that does not decode: %v", err)
	}
	mu.Lock()
	n := len(skipped)
	mu.Unlock()
	if n < 2 {
		t.Fatalf("skipped %v, want both bad records told", skipped)
	}
	if _, err := s.Decide(ctx, good.ID, approvals.Verdict{Approve: true, Approver: carol}); err != nil {
		t.Fatalf("deciding the good one: %v", err)
	}
	if _, err := s.Get(ctx, empty); !errors.Is(err, envelope.ErrDecode) {
		t.Fatalf("the bad record read alone: %v, want its decoding error", err)
	}
}
