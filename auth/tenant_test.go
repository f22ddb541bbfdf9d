package auth_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/auth"
	"github.com/capstan-dev/capstan/capstantest"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/execution"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/approvalsrpc"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/demo"
	"github.com/capstan-dev/capstan/internal/limits"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// A principal is a tenant (design §2, §6, §7, §17): one principal cannot take
// another's effect, replay an approval, learn of another's approval, or fill
// a limit the others need. Each attack runs with real credentials — alice,
// bob and erin, producers whose grants let them act as any user (gateways), carol
// an approver of finance, dave of legal — against the demo catalog, on the
// embedded server and on the official nats-server with the generated
// configuration, and checks that nothing of the victim's changed and that
// the victim's calls keep answering.

var tenantGrants = []auth.Grant{
	{Principal: "alice", Role: auth.RoleProducer, Actors: []string{"user:*"}, Capabilities: []string{"*"}},
	{Principal: "bob", Role: auth.RoleProducer, Actors: []string{"user:*"}, Capabilities: []string{"*"}},
	{Principal: "erin", Role: auth.RoleProducer, Actors: []string{"user:*"}, Capabilities: []string{"*"}},
	{Principal: "carol", Role: auth.RoleApprover, Actors: []string{"user:carol"}, Types: []string{"finance"}},
	{Principal: "dave", Role: auth.RoleApprover, Actors: []string{"user:dave"}, Types: []string{"legal"}},
}

// tenantRig is a secured deployment serving the demo catalog and t.spend
// (a budget and a concurrency limit per actor), with the broker's windows
// the test chooses.
type tenantRig struct {
	setup   *auth.Setup
	admin   *broker.Broker
	connect func(t *testing.T, principal string) *nats.Conn
	demo    jetstream.JetStream // the admin's, reading the demo's effects
}

// SpendInput is t.spend's input: an amount charged to the actor's budget,
// and how long the call holds its actor's one slot.
type SpendInput struct {
	Amount int64 `json:"amount"`
	HoldMs int   `json:"holdMs,omitempty"`
}

// tenantSetup makes the credentials of tenantGrants in a test's directory.
func tenantSetup(t *testing.T) *auth.Setup {
	t.Helper()
	setup, err := auth.Init(t.TempDir(), "")
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range tenantGrants {
		if err := setup.Add(g); err != nil {
			t.Fatal(err)
		}
	}
	return setup
}

// securedTenants starts an embedded server that requires tenantGrants'
// credentials, provisioned, its grants published; it returns the server
// and the admin's broker.
func securedTenants(t *testing.T) (*testenv.Env, *broker.Broker) {
	t.Helper()
	setup := tenantSetup(t)
	e := testenv.Start(t, testenv.Auth(setup))
	ctx := testCtx(t)
	admin, err := broker.Provision(ctx, e.Connect(t), broker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := auth.PublishGrants(ctx, admin.JS, setup, 0); err != nil {
		t.Fatal(err)
	}
	return e, admin
}

func newTenantRig(t *testing.T, d deployment, cfg broker.Config) *tenantRig {
	t.Helper()
	setup := tenantSetup(t)
	r := &tenantRig{setup: setup}
	var adminNC *nats.Conn
	switch d {
	case official:
		url := startOfficial(t, setup)
		r.connect = func(t *testing.T, p string) *nats.Conn { return connectWhenUp(t, testCtx(t), url, setup, p) }
		pushTo(t, url, setup)
		adminNC = r.connect(t, auth.AdminPrincipal)
	default:
		e := testenv.Start(t, testenv.Auth(setup))
		r.connect = func(t *testing.T, p string) *nats.Conn { return e.ConnectAs(t, p) }
		adminNC = e.Connect(t)
	}
	ctx := testCtx(t)
	var err error
	if r.admin, err = broker.Provision(ctx, adminNC, cfg); err != nil {
		t.Fatal(err)
	}
	if err := auth.PublishGrants(ctx, r.admin.JS, setup, 0); err != nil {
		t.Fatal(err)
	}
	workerNC := r.connect(t, auth.WorkerPrincipal)
	js, err := demo.Provision(ctx, workerNC, 1)
	if err != nil {
		t.Fatal(err)
	}
	r.demo = r.admin.JS
	spend := executor.Define("t.spend", executor.Meta{
		Description: "Spends from the actor's budget, one call at a time per actor.", Expose: executor.On(executor.SurfaceDirect),
		SideEffect: executor.SideEffectWrite, Timeout: 10 * time.Minute,
		Limits: []executor.Limit{
			{Kind: executor.LimitBudget, Per: executor.LimitPerActor, Name: "amount", Max: 100, Interval: time.Hour,
				AtLimit: executor.AtLimitRefuse, Amount: func(in any) (int64, error) { return in.(*SpendInput).Amount, nil }},
			{Kind: executor.LimitConcurrency, Per: executor.LimitPerActor, Max: 1},
		},
	}, func(ctx context.Context, c executor.Call[SpendInput]) (string, error) {
		select {
		case <-time.After(time.Duration(c.Input.HoldMs) * time.Millisecond):
		case <-ctx.Done():
			return "", ctx.Err()
		}
		return fmt.Sprintf("spent %d", c.Input.Amount), nil
	})
	reg, err := executor.NewRegistry(append(demo.Catalog(js), spend)...)
	if err != nil {
		t.Fatal(err)
	}
	capstantest.Worker(t, reg, capstantest.WithConn(workerNC),
		capstantest.WithConfig(executor.WorkerConfig{Pool: "tenant", Deployment: executor.Deployment(cfg), Lease: 2 * time.Second}))
	return r
}

// client is principal's client, calling as user:<principal> unless told.
func (r *tenantRig) client(t *testing.T, principal string) (*executor.Client, *nats.Conn) {
	t.Helper()
	nc := r.connect(t, principal)
	c, err := executor.NewClient(nc, executor.ClientConfig{Actor: envelope.Actor{Kind: envelope.ActorUser, ID: principal}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c, nc
}

// owned is what of one principal's is stored: the revision of each of its
// records, envelopes and approvals, and the events of each of its
// executions' trails.
type owned map[string]uint64

func (r *tenantRig) ownedBy(t *testing.T, principal string) owned {
	t.Helper()
	ctx := testCtx(t)
	out := owned{}
	var ids []string
	for _, bucket := range []jetstream.KeyValue{r.admin.Executions, r.admin.Envelopes} {
		keys, err := bucket.ListKeys(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for k := range keys.Keys() {
			id, ok := strings.CutPrefix(k, principal+".")
			if !ok {
				continue
			}
			e, err := bucket.Get(ctx, k)
			if errors.Is(err, jetstream.ErrKeyNotFound) {
				continue // expired between the listing and the read
			}
			if err != nil {
				t.Fatal(err)
			}
			out[bucket.Bucket()+"/"+k] = e.Revision()
			ids = append(ids, id)
		}
	}
	keys, err := r.admin.Approvals.ListKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for k := range keys.Keys() {
		rec, rev, err := broker.Load[approvals.Record](ctx, r.admin.Approvals, k)
		if err != nil {
			t.Fatal(err)
		}
		if rec.Principal == principal {
			out["approval/"+k] = rev
		}
	}
	slices.Sort(ids)
	for _, id := range slices.Compact(ids) {
		trail, err := audit.Read(ctx, r.admin.NC, r.admin.Names.Prefix(), principal, id)
		if err != nil {
			t.Fatal(err)
		}
		out["trail/"+id] = uint64(len(trail))
	}
	return out
}

// assertOwnedUnchanged fails unless everything of principal's is as before.
func (r *tenantRig) assertOwnedUnchanged(t *testing.T, principal string, before owned) {
	t.Helper()
	after := r.ownedBy(t, principal)
	for k, v := range before {
		if after[k] != v {
			t.Errorf("%s's %s changed: %d, before %d", principal, k, after[k], v)
		}
	}
	for k := range after {
		if _, ok := before[k]; !ok {
			t.Errorf("%s has a new %s", principal, k)
		}
	}
}

// keepsAnswering checks that principal's calls keep answering: an echo completes.
func keepsAnswering(t *testing.T, c *executor.Client, who string) {
	t.Helper()
	env, err := c.Call(testCtx(t), "demo.echo", map[string]any{"still": "here"})
	if err != nil || env.Status != envelope.StatusCompleted {
		t.Fatalf("%s's echo after the attack: %v %+v", who, err, env)
	}
}

func onBothServers(t *testing.T, cfg broker.Config, test func(t *testing.T, r *tenantRig)) {
	for _, d := range []deployment{embedded, official} {
		t.Run(d.String(), func(t *testing.T) {
			t.Parallel()
			test(t, newTenantRig(t, d, cfg))
		})
	}
}

// alice runs orders.refund and email.send under the execution ids bob will
// choose; bob's calls under the same ids are his own executions and make
// his own effects: the refunds bucket and the outbox hold both, each under
// its principal's key.
func TestTenant_SameIDTwoPrincipalsTwoEffects(t *testing.T) {
	t.Parallel()
	onBothServers(t, broker.Config{}, func(t *testing.T, r *tenantRig) {
		ctx := testCtx(t)
		alice, _ := r.client(t, "alice")
		bob, _ := r.client(t, "bob")
		calls := []struct {
			capability, id string
			input          func(who string, n int64) any
		}{
			{"orders.refund", "refund-42", func(who string, n int64) any { return demo.RefundInput{OrderID: "o-" + who, Amount: n} }},
			{"email.send", "email-7", func(who string, _ int64) any { return demo.EmailInput{To: who + "@example.com", Subject: "yours"} }},
		}
		for _, call := range calls {
			first, err := alice.Call(ctx, call.capability, call.input("alice", 100), executor.WithID(call.id))
			if err != nil || first.Status != envelope.StatusCompleted {
				t.Fatalf("alice's %s: %v %+v", call.capability, err, first)
			}
			before := r.ownedBy(t, "bob")
			got, err := bob.Call(ctx, call.capability, call.input("bob", 200), executor.WithID(call.id))
			if err != nil || got.Status != envelope.StatusCompleted || got.Recovered != nil {
				t.Fatalf("bob's %s under alice's id: %v %+v", call.capability, err, got)
			}
			if call.capability == "orders.refund" {
				var out demo.RefundOutput
				if err := got.Output.Decode(&out); err != nil || out.Repeated || out.OrderID != "o-bob" || out.Amount != 200 {
					t.Errorf("bob's refund: %+v (%v), want his own, not repeated", out, err)
				}
			}
			if len(r.ownedBy(t, "bob")) <= len(before) {
				t.Errorf("bob's call under alice's id stored nothing of his")
			}
		}
		// Both refunds, each under its principal's key, each with its input.
		kv, err := r.demo.KeyValue(ctx, demo.RefundsBucket)
		if err != nil {
			t.Fatal(err)
		}
		for who, amount := range map[string]int64{"alice": 100, "bob": 200} {
			e, err := kv.Get(ctx, envelope.IdempotencyKey(who, "refund-42"))
			if err != nil {
				t.Fatalf("%s's refund: %v", who, err)
			}
			var in demo.RefundInput
			if err := envelope.Unmarshal(e.Value(), &in); err != nil || in.OrderID != "o-"+who || in.Amount != amount {
				t.Errorf("%s's refund holds %+v (%v)", who, in, err)
			}
		}
		// Both emails, each sent once under its principal's key.
		for _, who := range []string{"alice", "bob"} {
			m, err := broker.LastFromLeader(ctx, r.admin.NC, demo.OutboxStream, demo.OutboxSubject+"."+envelope.IdempotencyKey(who, "email-7"))
			if err != nil {
				t.Fatalf("%s's email: %v", who, err)
			}
			if m.Header.Get(demo.PrincipalHeader) != who || !strings.HasPrefix(string(m.Data), who+"@") {
				t.Errorf("%s's email is %q from %s", who, m.Data, m.Header.Get(demo.PrincipalHeader))
			}
		}
		hc, err := demo.ReadCalls(ctx, r.demo)
		if err != nil || len(hc) != 4 {
			t.Fatalf("handler calls %+v (%v), want four: two per principal", hc, err)
		}
	})
}

// An approval authorizes one execution for ever. With short windows
// (envelopes 3 s, records 1 s after their last write, leases 2 s), alice
// resumes her approved refund under an id she chose; once its envelope and
// record have expired she publishes the same request again, under a message
// id the duplicate window does not know, and then under another id: both are
// refused APPROVAL_CONSUMED, with a denial on her trail, and the handler ran
// once. Nothing of bob's changed, and his calls keep answering.
func TestTenant_ConsumedApprovalNeverRunsAgain(t *testing.T) {
	t.Parallel()
	cfg := broker.Config{EnvelopeRetention: 3 * time.Second, RecordWindow: time.Second}
	onBothServers(t, cfg, func(t *testing.T, r *tenantRig) {
		ctx := testCtx(t)
		alice, aliceNC := r.client(t, "alice")
		bob, _ := r.client(t, "bob")
		carol := r.connect(t, "carol")
		refund := demo.RefundInput{OrderID: "o-1", Amount: 900}
		need, err := alice.Call(ctx, "orders.refund", refund)
		if err != nil || need.Status != envelope.StatusApprovalRequired {
			t.Fatalf("alice's refund: %v %+v", err, need)
		}
		approvalID := need.Approval.ID
		if _, err := approvalsrpc.Decide(ctx, carol, broker.NewNames(r.setup.Prefix), approvalsrpc.DecideRequest{ApprovalID: approvalID, Approve: true}); err != nil {
			t.Fatal(err)
		}
		const id = "refund-42"
		done, err := alice.Resume(ctx, approvalID, executor.WithID(id))
		if err != nil || done.Status != envelope.StatusCompleted {
			t.Fatalf("alice's resume: %v %+v", err, done)
		}
		handlerCalls := func() int {
			t.Helper()
			hc, err := demo.ReadCalls(ctx, r.demo)
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for _, c := range hc {
				if c.CapabilityID == "orders.refund" {
					n++
				}
			}
			return n
		}
		if n := handlerCalls(); n != 1 {
			t.Fatalf("the resume called the handler %d times", n)
		}
		// bob's own refund, before the attack. With windows this short his
		// record and envelope go by themselves: what must not change is what
		// outlives them, his trail and his effect.
		bobs, err := bob.Call(ctx, "orders.refund", demo.RefundInput{OrderID: "o-b", Amount: 50})
		if err != nil || bobs.Status != envelope.StatusCompleted {
			t.Fatalf("bob's refund: %v %+v", err, bobs)
		}
		waitGone(t, r.admin.Executions, broker.Key("alice", id))
		waitGone(t, r.admin.Envelopes, broker.Key("alice", id))
		bobBefore := r.durableOf(t, "bob", bobs.ExecutionID)

		js, err := jetstream.New(aliceNC)
		if err != nil {
			t.Fatal(err)
		}
		replay := func(executionID, msgID string) *envelope.Envelope {
			t.Helper()
			req := &envelope.Request{V: envelope.Version, ExecutionID: executionID, CapabilityID: "orders.refund", ApprovalID: approvalID,
				Input: envelope.MustRaw(refund), Actor: envelope.Actor{Kind: envelope.ActorUser, ID: "alice"},
				Surface: string(executor.SurfaceDirect), SubmittedAt: time.Now().UTC()}
			data, err := envelope.Marshal(req)
			if err != nil {
				t.Fatal(err)
			}
			m := nats.NewMsg(broker.NewNames(r.setup.Prefix).ExecSubject("alice", "orders.refund"))
			m.Data = data
			m.Header.Set(jetstream.MsgIDHeader, msgID)
			if _, err := js.PublishMsg(ctx, m); err != nil {
				t.Fatalf("alice's replay: %v", err)
			}
			env, err := alice.Await(ctx, executionID)
			if err != nil {
				t.Fatalf("await the replay %s: %v", executionID, err)
			}
			return env
		}
		for _, try := range []struct{ id, msgID, reason string }{
			{id, broker.Key("alice", id) + ".replay", "approval-used-before"},
			{"refund-43", broker.Key("alice", "refund-43"), "approval-consumed"},
		} {
			got := replay(try.id, try.msgID)
			if got.Status != envelope.StatusFailed || got.Error == nil || got.Error.Code != envelope.CodeApprovalConsumed {
				t.Fatalf("replay as %s: %s %+v, want APPROVAL_CONSUMED", try.id, got.Status, got.Error)
			}
			trail := waitTrailEvent(t, r.admin, "alice", try.id, audit.EventDenied)
			if trail.Data["reason"] != try.reason || trail.Data["publicCode"] != string(envelope.CodeApprovalConsumed) {
				t.Errorf("replay as %s: denial %v, want %s", try.id, trail.Data, try.reason)
			}
		}
		if n := handlerCalls(); n != 2 { // the resume's and bob's own refund
			t.Fatalf("the refund handler ran %d times, want alice's resume and bob's refund once each", n)
		}
		rec, _, err := broker.Load[approvals.Record](ctx, r.admin.Approvals, approvalID)
		if err != nil || rec.Status != approvals.StatusConsumed || rec.ConsumedBy != id {
			t.Fatalf("the approval after the replays: %v %+v", err, rec)
		}
		if after := r.durableOf(t, "bob", bobs.ExecutionID); !maps.Equal(after, bobBefore) {
			t.Errorf("bob's trail, approvals or refund changed: %v, before %v", after, bobBefore)
		}
		keepsAnswering(t, bob, "bob")
	})
}

// durableOf is what of principal's outlives short windows: the trail of each
// of its executions ids, its approvals, and the refunds under its keys.
func (r *tenantRig) durableOf(t *testing.T, principal string, ids ...string) owned {
	t.Helper()
	ctx := testCtx(t)
	out := owned{}
	kv, err := r.demo.KeyValue(ctx, demo.RefundsBucket)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		trail, err := audit.Read(ctx, r.admin.NC, r.admin.Names.Prefix(), principal, id)
		if err != nil {
			t.Fatal(err)
		}
		out["trail/"+id] = uint64(len(trail))
		if e, err := kv.Get(ctx, envelope.IdempotencyKey(principal, id)); err == nil {
			out["refund/"+id] = e.Revision()
		}
	}
	for k, v := range r.ownedBy(t, principal) {
		if strings.HasPrefix(k, "approval/") {
			out[k] = v
		}
	}
	return out
}

// alice sends six demo.report, which hold their slots as long as they run:
// three take a slot (her share of the four), three wait; bob's report takes
// the fourth and completes. A per-actor budget and slot of one gateway's
// user:123 are not another gateway's user:123's: alice's user:123 spends
// its budget and holds its slot, bob's user:123 still spends and runs.
func TestTenant_LimitsOneCallerCannotFill(t *testing.T) {
	t.Parallel()
	onBothServers(t, broker.Config{}, func(t *testing.T, r *tenantRig) {
		ctx := testCtx(t)
		alice, _ := r.client(t, "alice")
		bob, _ := r.client(t, "bob")
		var held []string
		for range 6 {
			id, err := alice.Submit(ctx, "demo.report", demo.ReportInput{Pages: 50, PageMs: 10_000})
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, id)
		}
		t.Cleanup(func() {
			for _, id := range held {
				_, _ = alice.Cancel(context.Background(), id)
			}
		})
		slotsOf := func(principal string) int {
			t.Helper()
			us, err := limits.Read(ctx, r.admin.Limits, "demo.report", time.Now())
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for _, u := range us {
				for _, h := range u.Holders {
					if h.Principal() == principal {
						n++
					}
				}
			}
			return n
		}
		waitFor(t, "alice's reports hold her share of the slots", func() bool { return slotsOf("alice") == 3 })
		waitFor(t, "alice's other reports wait at her share", func() bool {
			for _, id := range held {
				ev, err := audit.Read(ctx, r.admin.NC, r.admin.Names.Prefix(), "alice", id)
				if err == nil && slices.ContainsFunc(ev, func(e audit.Event) bool {
					return e.Type == audit.EventLimited && e.Data["principalMax"] != nil
				}) {
					return true
				}
			}
			return false
		})
		got, err := bob.Call(ctx, "demo.report", demo.ReportInput{Pages: 1, PageMs: 1})
		if err != nil || got.Status != envelope.StatusCompleted {
			t.Fatalf("bob's report beside alice's six: %v %+v", err, got)
		}
		if n := slotsOf("alice"); n != 3 {
			t.Errorf("alice holds %d slots, want her share of 3", n)
		}

		// Two gateways' user:123: two actors, two budgets, two slots.
		as123 := executor.As(envelope.Actor{Kind: envelope.ActorUser, ID: "123"})
		if env, err := alice.Call(ctx, "t.spend", SpendInput{Amount: 100}, as123); err != nil || env.Status != envelope.StatusCompleted {
			t.Fatalf("alice's user:123 spends its budget: %v %+v", err, env)
		}
		if env, err := alice.Call(ctx, "t.spend", SpendInput{Amount: 1}, as123); err != nil || env.Error == nil || env.Error.Code != envelope.CodeRateLimited {
			t.Fatalf("alice's user:123 over its budget: %v %+v, want RATE_LIMITED", err, env)
		}
		holding, err := alice.Submit(ctx, "t.spend", SpendInput{HoldMs: 600_000}, as123)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, holding)
		waitFor(t, "alice's user:123 holds its slot", func() bool {
			st, err := alice.Status(ctx, holding)
			return err == nil && st.Record != nil && st.Record.State == execution.StateRunning
		})
		bobBefore := r.ownedBy(t, "bob")
		env, err := bob.Call(ctx, "t.spend", SpendInput{Amount: 100}, as123)
		if err != nil || env.Status != envelope.StatusCompleted {
			t.Fatalf("bob's user:123 beside alice's: %v %+v, want its own budget and slot", err, env)
		}
		if len(r.ownedBy(t, "bob")) <= len(bobBefore) {
			t.Error("bob's call stored nothing")
		}
		us, err := limits.Read(ctx, r.admin.Limits, "t.spend", time.Now())
		if err != nil {
			t.Fatal(err)
		}
		whose := map[string]bool{}
		for _, u := range us {
			whose[string(u.Kind)+" "+u.Who] = true
		}
		for _, want := range []string{"budget alice/user:123", "budget bob/user:123", "concurrency alice/user:123"} {
			if !whose[want] {
				t.Errorf("no counter %q among %v", want, whose)
			}
		}
		keepsAnswering(t, bob, "bob")
	})
}

// bob, a producer, and dave, an approver of legal, ask about alice's
// finance approval: every refusal is the one an id of nothing gets, word for
// word, on the envelope, the trail and the record they may read, and names
// neither alice nor the approval's types. Nothing of alice's changes.
func TestTenant_RefusalsDoNotRevealAnotherPrincipalsApproval(t *testing.T) {
	t.Parallel()
	onBothServers(t, broker.Config{}, func(t *testing.T, r *tenantRig) {
		ctx := testCtx(t)
		alice, _ := r.client(t, "alice")
		bob, _ := r.client(t, "bob")
		dave := r.connect(t, "dave")
		need, err := alice.Call(ctx, "orders.refund", demo.RefundInput{OrderID: "o-1", Amount: 900})
		if err != nil || need.Status != envelope.StatusApprovalRequired {
			t.Fatalf("alice's refund: %v %+v", err, need)
		}
		theirs, none := need.Approval.ID, envelope.NewExecutionID()
		aliceBefore := r.ownedBy(t, "alice")
		same := func(what string, got, want string) {
			t.Helper()
			g, w := strings.ReplaceAll(got, theirs, "ID"), strings.ReplaceAll(want, none, "ID")
			if g != w {
				t.Errorf("%s: %q about alice's approval, %q about none", what, g, w)
			}
			for _, secret := range []string{"alice", "finance"} {
				if strings.Contains(got, secret) {
					t.Errorf("%s: %q names %s", what, got, secret)
				}
			}
		}
		// Showing it, through the workers.
		_, errTheirs := bob.ListApprovals(ctx, approvals.ListRequest{ID: theirs})
		_, errNone := bob.ListApprovals(ctx, approvals.ListRequest{ID: none})
		if errTheirs == nil || !errors.Is(errTheirs, approvals.ErrNotFound) {
			t.Fatalf("bob shows alice's approval: %v", errTheirs)
		}
		same("bob's showing", errTheirs.Error(), errNone.Error())
		// Deciding it, as an approver of other types.
		_, errTheirs = approvalsrpc.Decide(ctx, dave, broker.NewNames(r.setup.Prefix), approvalsrpc.DecideRequest{ApprovalID: theirs, Approve: true})
		_, errNone = approvalsrpc.Decide(ctx, dave, broker.NewNames(r.setup.Prefix), approvalsrpc.DecideRequest{ApprovalID: none, Approve: true})
		if errTheirs == nil || !errors.Is(errTheirs, approvals.ErrNotFound) {
			t.Fatalf("dave decides alice's finance approval: %v", errTheirs)
		}
		same("dave's decision", errTheirs.Error(), errNone.Error())
		// Resuming it: the envelope, the trail and the record bob reads.
		resumed := func(approvalID string) (*envelope.Envelope, audit.Event, *execution.Record) {
			t.Helper()
			env, err := bob.Resume(ctx, approvalID)
			if err != nil {
				t.Fatalf("bob's resume: %v", err)
			}
			// The worker files the trail after the envelope: read until the
			// denial is there.
			var view *executor.ExecutionView
			var denied audit.Event
			waitFor(t, "the denial on the trail of bob's resume", func() bool {
				v, err := bob.Execution(ctx, executor.ExecutionRequest{ExecutionID: env.ExecutionID})
				if err != nil {
					return false // a quota's refusal: asked again
				}
				view = v
				for _, ev := range view.Trail {
					if ev.Type == audit.EventDenied {
						denied = ev
						return true
					}
				}
				return false
			})
			return env, denied, view.Record
		}
		envT, evT, recT := resumed(theirs)
		envN, evN, recN := resumed(none)
		if envT.Error == nil || envN.Error == nil {
			t.Fatalf("resumes: %+v, %+v", envT, envN)
		}
		same("the envelope", fmt.Sprint(envT.Status, envT.Error.Code, envT.Error.Message), fmt.Sprint(envN.Status, envN.Error.Code, envN.Error.Message))
		same("the trail", fmt.Sprint(evT.Data), fmt.Sprint(evN.Data))
		if recT != nil || recN != nil {
			causeT, causeN := "", ""
			if recT != nil {
				causeT = recT.Cause
			}
			if recN != nil {
				causeN = recN.Cause
			}
			same("the record's cause", causeT, causeN)
		}
		rec, _, err := broker.Load[approvals.Record](ctx, r.admin.Approvals, theirs)
		if err != nil || rec.Status != approvals.StatusPending || rec.Decision != nil {
			t.Fatalf("alice's approval after bob's and dave's attempts: %v %+v", err, rec)
		}
		r.assertOwnedUnchanged(t, "alice", aliceBefore)
		keepsAnswering(t, alice, "alice")
	})
}

// waitGone waits until key has left bucket (its TTL).
func waitGone(t *testing.T, kv jetstream.KeyValue, key string) {
	t.Helper()
	waitFor(t, kv.Bucket()+"/"+key+" expired", func() bool {
		_, err := kv.Get(testCtx(t), key)
		return errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted)
	})
}

// waitTrailEvent waits for principal's execution id's event of typ.
func waitTrailEvent(t *testing.T, b *broker.Broker, principal, id, typ string) audit.Event {
	t.Helper()
	var found audit.Event
	waitFor(t, "a "+typ+" event on "+id+"'s trail", func() bool {
		trail, err := audit.Read(testCtx(t), b.NC, b.Names.Prefix(), principal, id)
		if err != nil {
			return false
		}
		for _, ev := range trail {
			if ev.Type == typ {
				found = ev
				return true
			}
		}
		return false
	})
	return found
}

// waitFor waits until cond holds, failing the test when its context ends.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	ctx := testCtx(t)
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("never: %s", what)
		case <-time.After(25 * time.Millisecond):
		}
	}
}

// An approver's own Client (it reads catalog entries by key, and subscribes
// to its own envelope subjects) reaches nothing of a producer's: dave reads
// none of bob's envelopes, receives none of them, submits nothing, and her
// flood of decisions of approvals she may not decide changes nothing of
// bob's, whose calls and listings keep answering.
func TestTenant_ApproverClientReachesNothingOfAProducers(t *testing.T) {
	t.Parallel()
	onBothServers(t, broker.Config{}, func(t *testing.T, r *tenantRig) {
		ctx := testCtx(t)
		bob, _ := r.client(t, "bob")
		echo, err := bob.Call(ctx, "demo.echo", map[string]any{"secret": "of bob"})
		if err != nil || echo.Status != envelope.StatusCompleted {
			t.Fatalf("bob's echo: %v %+v", err, echo)
		}
		refund, err := bob.Call(ctx, "orders.refund", demo.RefundInput{OrderID: "o-7", Amount: 900})
		if err != nil || refund.Status != envelope.StatusApprovalRequired {
			t.Fatalf("bob's refund: %v %+v", err, refund)
		}
		daveNC := r.connect(t, "dave")
		dave, err := executor.NewClient(daveNC, executor.ClientConfig{})
		if err != nil {
			t.Fatalf("dave's client: %v", err)
		}
		defer dave.Close()
		n := broker.NewNames(r.setup.Prefix)
		// Bob's envelope by key, as a producer reads its own.
		get := "$JS.API.DIRECT.GET.KV_" + n.EnvelopesBucket() + ".$KV." + n.EnvelopesBucket() + "." + broker.Key("bob", echo.ExecutionID)
		short, cancel := context.WithTimeout(ctx, 2*time.Second)
		if m, err := daveNC.RequestWithContext(short, get, nil); err == nil && len(m.Data) > 0 && m.Header.Get("Status") == "" {
			t.Errorf("dave read bob's envelope: %q", m.Data)
		}
		cancel()
		// Bob's envelopes as they are stored.
		sub, err := daveNC.SubscribeSync(n.EnvelopeSubjectsOf("bob"))
		if err != nil {
			t.Fatal(err)
		}
		if err := daveNC.Flush(); err != nil {
			t.Fatal(err)
		}
		keepsAnswering(t, bob, "bob")
		if m, err := sub.NextMsg(500 * time.Millisecond); err == nil {
			t.Errorf("dave received bob's envelope on %s", m.Subject)
		}
		before := r.ownedBy(t, "bob")
		// A call of her own, and bob's status.
		short, cancel = context.WithTimeout(ctx, 3*time.Second)
		if env, err := dave.Call(short, "demo.echo", map[string]any{"from": "dave"}); err == nil && env.Status == envelope.StatusCompleted {
			t.Errorf("dave's call ran: %+v", env)
		}
		cancel()
		short, cancel = context.WithTimeout(ctx, 3*time.Second)
		if st, err := dave.StatusOf(short, "bob", echo.ExecutionID); err == nil && st.Envelope != nil {
			t.Errorf("dave read bob's status: %+v", st.Envelope)
		}
		cancel()
		// A flood of decisions of bob's finance approval and of ids that do not exist.
		flood := testCtx(t)
		for i := range 40 {
			id := refund.Approval.ID
			if i%2 == 1 {
				id = envelope.NewExecutionID()
			}
			if _, err := dave.Decide(flood, id, approvals.Verdict{Approve: true}); err == nil {
				t.Fatalf("dave decided %s", id)
			}
		}

		r.assertOwnedUnchanged(t, "bob", before)
		keepsAnswering(t, bob, "bob")
		page, err := bob.ListApprovals(testCtx(t), approvals.ListRequest{})
		if err != nil || len(page.Records) != 1 || page.Records[0].Status != approvals.StatusPending {
			t.Fatalf("bob's listing after the attack: %+v (%v)", page, err)
		}
	})
}
