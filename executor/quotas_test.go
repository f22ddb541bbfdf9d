package executor_test

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/auth"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/approvalsrpc"
	"github.com/capstan-dev/capstan/internal/approvalstore"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/demo"
	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/capstan-dev/capstan/internal/testhooks"
	"github.com/capstan-dev/capstan/observe"
)

// refusals counts a worker's refusals by quota and principal, as its
// metric does.
type refusals struct {
	observe.NopWorker
	mu sync.Mutex
	by map[string]int
}

func (r *refusals) QuotaExceeded(quota, principal string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.by[quota+" "+principal]++
}

func (r *refusals) of(quota, principal string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.by[quota+" "+principal]
}

// clock is a time a test moves by hand.
type clock struct{ ns atomic.Int64 }

func (c *clock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *clock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// quotaRig is a secured deployment: alice produces under small quotas (5
// control requests a second, 3 approvals pending), bob under the defaults,
// carol approves finance; one worker serves the demo catalog
// (orders.refund asks finance above 500) on a clock the test moves.
type quotaRig struct {
	env   *testenv.Env
	admin *broker.Broker
	seen  *refusals
	clock *clock
	conns map[string]*nats.Conn
}

func newQuotaRig(t *testing.T) *quotaRig {
	t.Helper()
	setup, err := auth.Init(t.TempDir(), "")
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range []auth.Grant{
		{Principal: "alice", Role: auth.RoleProducer, Actors: []string{"user:alice"}, Capabilities: []string{"*"},
			Quotas: &auth.Quotas{QueuedRequests: 1000, QueuedBytes: 1 << 20, PendingApprovals: 3, ControlPerSecond: 5}},
		{Principal: "bob", Role: auth.RoleProducer, Actors: []string{"user:bob"}, Capabilities: []string{"*"}},
		{Principal: "carol", Role: auth.RoleApprover, Actors: []string{"user:carol"}, Types: []string{"finance"}},
	} {
		if err := setup.Add(g); err != nil {
			t.Fatal(err)
		}
	}
	r := &quotaRig{env: testenv.Start(t, testenv.Auth(setup)), seen: &refusals{by: map[string]int{}}, clock: &clock{},
		conns: map[string]*nats.Conn{}}
	r.clock.ns.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	if r.admin, err = broker.Provision(ctxT(t), r.env.Connect(t), broker.Config{}); err != nil {
		t.Fatal(err)
	}
	if err := auth.PublishGrants(ctxT(t), r.admin.JS, setup, 0); err != nil {
		t.Fatal(err)
	}
	js, err := demo.Provision(ctxT(t), r.env.Connect(t), 1)
	if err != nil {
		t.Fatal(err)
	}
	cfg := testhooks.Worker(executor.WorkerConfig{Observer: r.seen}, testhooks.WorkerKnobs{ControlClock: r.clock.now})
	startWorker(t, r.env.ConnectAs(t, auth.WorkerPrincipal), cfg, demo.Catalog(js)...)
	for _, p := range []string{"alice", "bob", "carol"} {
		r.conns[p] = r.env.ConnectAs(t, p)
	}
	return r
}

func (r *quotaRig) client(t *testing.T, p string) *executor.Client {
	t.Helper()
	c, err := executor.NewClient(r.conns[p], executor.ClientConfig{Actor: envelope.Actor{Kind: "user", ID: p}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// assertQuotaRefusal checks err is the controlPerSecond refusal, with its
// figures, as every control request's client gives it.
func assertQuotaRefusal(t *testing.T, what string, err error, quota string, limit int64) {
	t.Helper()
	var cerr *envelope.CapabilityError
	if !errors.Is(err, envelope.ErrQuotaExceeded) || !errors.As(err, &cerr) {
		t.Fatalf("%s: %v, want QUOTA_EXCEEDED", what, err)
	}
	m := cerr.ForModel()
	if m.Code != envelope.CodeQuotaExceeded || fmt.Sprint(m.Details["quota"]) != quota || fmt.Sprint(m.Details["limit"]) != fmt.Sprint(limit) {
		t.Fatalf("%s: the model sees %+v", what, m)
	}
	if quota == envelope.QuotaControlPerSecond && (!m.Retryable || fmt.Sprint(m.Details["retryAfterMs"]) == "<nil>") {
		t.Fatalf("%s: no retryAfterMs in %+v", what, m)
	}
}

// Every control request counts against its principal's controlPerSecond:
// beyond it, each is refused at once in its own reply's form, which its
// client turns into QUOTA_EXCEEDED with the figures; each refusal is
// counted. The quota is the principal's: bob is served throughout, and a
// second later alice is served again. The clock stands still unless the
// test moves it, so every figure is a count.
func TestControlQuota_RefusedAtTheDoorEveryRequestKind(t *testing.T) {
	t.Parallel()
	r := newQuotaRig(t)
	ctx := ctxT(t)
	alice, bob := r.client(t, "alice"), r.client(t, "bob")
	n := r.admin.Names
	id := envelope.NewExecutionID()
	kinds := []struct {
		name string
		call func(c *executor.Client, nc *nats.Conn) error
	}{
		{"describe", func(c *executor.Client, _ *nats.Conn) error {
			_, err := c.Describe(ctx, "", envelope.Actor{}, executor.Scope{})
			return err
		}},
		{"executions list", func(c *executor.Client, _ *nats.Conn) error {
			_, err := c.Executions(ctx, executor.ExecutionsRequest{})
			return err
		}},
		{"probe", func(c *executor.Client, _ *nats.Conn) error {
			_, err := c.Execution(ctx, executor.ExecutionRequest{ExecutionID: id, Probe: true})
			return err
		}},
		{"cancel", func(c *executor.Client, _ *nats.Conn) error {
			_, err := c.Cancel(ctx, id)
			return err
		}},
		{"approvals list", func(_ *executor.Client, nc *nats.Conn) error {
			_, err := approvalsrpc.List(ctx, nc, n, approvals.ListRequest{})
			return err
		}},
	}
	served, refused := 0, 0
	for i := range 20 {
		k := kinds[i%len(kinds)]
		err := k.call(alice, r.conns["alice"])
		if errors.Is(err, envelope.ErrQuotaExceeded) {
			assertQuotaRefusal(t, k.name, err, envelope.QuotaControlPerSecond, 5)
			refused++
			continue
		}
		served++
		// Bob, meanwhile, is served, every kind.
		if err := kinds[i%len(kinds)].call(bob, r.conns["bob"]); errors.Is(err, envelope.ErrQuotaExceeded) {
			t.Fatalf("bob's %s refused for alice's quota: %v", k.name, err)
		}
	}
	if served != 5 || refused != 15 {
		t.Fatalf("alice served %d, refused %d of 20 at one instant; want her quota of 5 served", served, refused)
	}
	if got := r.seen.of(envelope.QuotaControlPerSecond, "alice"); got != 15 {
		t.Fatalf("the metric counted %d refusals of alice's, want 15", got)
	}
	if got := r.seen.of(envelope.QuotaControlPerSecond, "bob"); got != 0 {
		t.Fatalf("the metric counted %d refusals of bob's", got)
	}
	// A decision is a control request too (carol is an approver).
	carol := r.conns["carol"]
	for range 50 {
		_, _ = approvalsrpc.List(ctx, carol, n, approvals.ListRequest{})
	}
	_, err := approvalsrpc.Decide(ctx, carol, n, approvalsrpc.DecideRequest{ApprovalID: envelope.NewExecutionID(), Approve: true})
	assertQuotaRefusal(t, "decision", err, envelope.QuotaControlPerSecond, auth.DefaultQuotas.ControlPerSecond)

	// A second later, alice has her quota again.
	r.clock.advance(time.Second)
	for i := range 5 {
		if err := kinds[i].call(alice, r.conns["alice"]); errors.Is(err, envelope.ErrQuotaExceeded) {
			t.Fatalf("alice's %s a second later: %v", kinds[i].name, err)
		}
	}
	if err := kinds[0].call(alice, r.conns["alice"]); !errors.Is(err, envelope.ErrQuotaExceeded) {
		t.Fatalf("alice's sixth request of the second: %v", err)
	}
}

// A request that would give a principal one pending approval more than its
// quota ends QUOTA_EXCEEDED, model-visible, without an approval created;
// once one is decided, the next is asked again. Bob's are his own.
func TestPendingApprovalsQuota_RefusedWithoutCreatingOne(t *testing.T) {
	t.Parallel()
	r := newQuotaRig(t)
	ctx := ctxT(t)
	alice, bob := r.client(t, "alice"), r.client(t, "bob")
	refund := func(c *executor.Client, order string) *envelope.Envelope {
		t.Helper()
		env, err := c.Call(ctx, "orders.refund", map[string]any{"orderId": order, "amount": 501})
		if err != nil {
			t.Fatal(err)
		}
		return env
	}
	var asked []string
	over := 0
	for i := range 6 {
		env := refund(alice, fmt.Sprint("a", i))
		switch {
		case env.Status == envelope.StatusApprovalRequired:
			asked = append(asked, env.Approval.ID)
		case env.Error != nil && env.Error.Code == envelope.CodeQuotaExceeded:
			m := env.ForModel()
			if fmt.Sprint(m.Details["quota"]) != envelope.QuotaPendingApprovals || fmt.Sprint(m.Details["limit"]) != "3" || !m.Retryable {
				t.Fatalf("the model sees %+v", m)
			}
			over++
		default:
			t.Fatalf("alice's refund %d: %+v", i, env)
		}
	}
	if len(asked) != 3 || over != 3 {
		t.Fatalf("alice asked %d approvals and was refused %d times, want 3 and 3", len(asked), over)
	}
	if got := r.seen.of(envelope.QuotaPendingApprovals, "alice"); got != 3 {
		t.Fatalf("the metric counted %d, want 3", got)
	}
	all, err := approvalstore.NewStore(r.admin.Approvals, nil).List(ctx, approvalstore.Filter{})
	if err != nil || len(all) != 3 {
		t.Fatalf("the bucket holds %d approvals (%v), want alice's 3", len(all), err)
	}
	// Bob's quota is his own.
	if env := refund(bob, "b0"); env.Status != envelope.StatusApprovalRequired {
		t.Fatalf("bob's refund: %+v", env)
	}
	// A decision frees one of alice's.
	if _, err := approvalsrpc.Decide(ctx, r.conns["carol"], r.admin.Names,
		approvalsrpc.DecideRequest{ApprovalID: asked[0], Approve: false}); err != nil {
		t.Fatal(err)
	}
	if env := refund(alice, "a-after"); env.Status != envelope.StatusApprovalRequired {
		t.Fatalf("alice's refund after a decision: %+v", env)
	}
}

// The events of a principal's descriptions within an interval are one
// event for each distinct description, sixteen at most, and one that counts
// the rest: thirty identical describes grow the trail by two events, forty
// different ones (each its own scope) by seventeen.
func TestDescribe_AuditEventsCoalescedPerPrincipal(t *testing.T) {
	t.Parallel()
	r := newQuotaRig(t)
	ctx := ctxT(t)
	bob := r.client(t, "bob")
	before := auditMsgs(t, r.admin)
	for i := range 30 {
		if _, err := bob.Describe(ctx, "", envelope.Actor{}, executor.Scope{}); err != nil {
			t.Fatalf("describe %d: %v", i, err)
		}
	}
	waitAuditMsgs(t, r.admin, before+1)
	// The interval ends: one event counts the 29 others.
	r.clock.advance(time.Minute)
	waitAuditMsgs(t, r.admin, before+2)
	evs := discovered(t, r.admin, "bob")
	if len(evs) != 2 || fmt.Sprint(evs[1].Data["coalesced"]) != "29" {
		t.Fatalf("bob's discovered events: %+v, want his first and one of 29", evs)
	}
	if got := auditMsgs(t, r.admin); got != before+2 {
		t.Fatalf("the trail grew by %d messages for 30 describes, want 2", got-before)
	}

	// Forty descriptions, each of another scope, in the next interval.
	for i := range 40 {
		if _, err := bob.Describe(ctx, "", envelope.Actor{}, executor.Scope{Prefix: fmt.Sprint("p", i)}); err != nil {
			t.Fatalf("describe %d: %v", i, err)
		}
	}
	waitAuditMsgs(t, r.admin, before+2+16)
	r.clock.advance(time.Minute)
	waitAuditMsgs(t, r.admin, before+2+17)
	evs = discovered(t, r.admin, "bob")
	if len(evs) != 2+17 || fmt.Sprint(evs[len(evs)-1].Data["coalesced"]) != "24" {
		t.Fatalf("bob's discovered events: %d, the last %+v; want 17 more, the last of 24", len(evs), evs[len(evs)-1].Data)
	}
	if got := auditMsgs(t, r.admin); got != before+2+17 {
		t.Fatalf("the trail grew by %d messages, want 19", got-before)
	}
}

func auditMsgs(t *testing.T, b *broker.Broker) uint64 {
	t.Helper()
	info, err := b.Audit.Info(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

func waitAuditMsgs(t *testing.T, b *broker.Broker, want uint64) {
	t.Helper()
	ctx := ctxT(t)
	for auditMsgs(t, b) < want {
		select {
		case <-ctx.Done():
			t.Fatalf("the audit stream holds %d messages, want %d", auditMsgs(t, b), want)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// discovered reads the audit stream's capabilities.discovered events of
// principal, in order.
func discovered(t *testing.T, b *broker.Broker, principal string) []audit.Event {
	t.Helper()
	ctx := ctxT(t)
	info, err := b.Audit.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []audit.Event
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		m, err := b.Audit.GetMsg(ctx, seq)
		if err != nil {
			continue
		}
		evs, err := audit.Decode(m.Data)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range evs {
			if ev.Type == audit.EventDiscovered && ev.Principal == principal {
				out = append(out, ev)
			}
		}
	}
	return out
}
