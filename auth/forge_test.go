package auth_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/auth"
	"github.com/capstan-dev/capstan/capstantest"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/approvalsrpc"
	"github.com/capstan-dev/capstan/internal/approvalstore"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/capstan-dev/capstan/internal/testhooks"
)

// Every test here attacks with a producer's real credentials against a real
// server with authentication and a real worker, and checks that the server
// or the worker refused it and that records, envelopes, approvals and the
// trail are what they would have been without the attack.

type Echo struct {
	Text string `json:"text"`
}

type Refund struct {
	OrderID string `json:"orderId"`
	Amount  int    `json:"amount"`
}

// rig is a secured deployment: a server (or cluster) with authentication,
// grants published, one worker connected as the worker principal.
type rig struct {
	setup   *auth.Setup
	admin   *broker.Broker
	url     string
	nodes   []string // every server's own URL
	connect func(t *testing.T, principal string, opts ...nats.Option) *nats.Conn
	// push sends the setup's accounts to the servers.
	push func(t *testing.T)
	// effects counts the handlers' effects, per capability.
	sends, refunds atomic.Int64
	// reported is closed to let t.report's handlers return.
	reported     chan struct{}
	reportedOnce sync.Once
	// knobs are the worker's test options.
	knobs testhooks.WorkerKnobs
}

// deployment says what a rig runs on.
type deployment int

const (
	embedded deployment = iota // one embedded server
	cluster                    // three embedded servers routed together
	official                   // an official nats-server binary, as a deployment runs it
	legacy                     // one embedded server on a one-account setup (v1)
)

func (d deployment) String() string {
	return [...]string{"embedded", "cluster", "official", "legacy"}[d]
}

// rigGrants are the principals of every rig.
var rigGrants = []auth.Grant{
	{Principal: "alice", Role: auth.RoleProducer, Actors: []string{"user:alice"}, Surfaces: []string{"direct"}, Capabilities: []string{"*"}},
	{Principal: "bob", Role: auth.RoleProducer, Actors: []string{"user:bob"}, Capabilities: []string{"*"}},
	{Principal: "carol", Role: auth.RoleApprover, Actors: []string{"user:carol"}, Types: []string{"finance"}},
	{Principal: "dana", Role: auth.RoleProducer, Actors: []string{"user:dana"}, Capabilities: []string{"t.echo"}},
}

func newRig(t *testing.T, onCluster bool) *rig {
	t.Helper()
	if onCluster {
		return newRigOn(t, cluster)
	}
	return newRigOn(t, embedded)
}

// newRigOn starts a secured deployment on d with the rig's principals,
// provisions it, publishes the grants and starts the worker.
func newRigOn(t *testing.T, d deployment) *rig { return newRigWith(t, d, nil) }

// newRigWith is newRigOn with prepare run on the rig (its setup, its
// worker's knobs) before anything starts.
func newRigWith(t *testing.T, d deployment, prepare func(*rig)) *rig {
	t.Helper()
	r := &rig{}
	var setup *auth.Setup
	if d == legacy {
		setup = testenv.LegacySetup(t, t.TempDir(), rigGrants...)
	} else {
		var err error
		if setup, err = auth.Init(t.TempDir(), ""); err != nil {
			t.Fatal(err)
		}
		for _, g := range rigGrants {
			if err := setup.Add(g); err != nil {
				t.Fatal(err)
			}
		}
	}
	r.setup = setup
	if prepare != nil {
		prepare(r)
	}
	var adminNC *nats.Conn
	switch d {
	case cluster:
		c := testenv.StartCluster(t, 3, testenv.Auth(setup))
		r.connect = func(t *testing.T, p string, opts ...nats.Option) *nats.Conn { return c.ConnectAs(t, p, opts...) }
		r.push = func(t *testing.T) { c.PushAccounts(t) }
		r.url, r.nodes = c.URL(), c.URLs
		adminNC = c.Connect(t)
	case official:
		r.url = startOfficial(t, setup)
		r.nodes = []string{r.url}
		r.connect = func(t *testing.T, p string, opts ...nats.Option) *nats.Conn {
			return connectWhenUp(t, testCtx(t), r.url, setup, p, opts...)
		}
		r.push = func(t *testing.T) { pushTo(t, r.url, setup) }
		r.push(t)
		adminNC = r.connect(t, auth.AdminPrincipal)
	default:
		e := testenv.Start(t, testenv.Auth(setup))
		r.connect = func(t *testing.T, p string, opts ...nats.Option) *nats.Conn { return e.ConnectAs(t, p, opts...) }
		r.push = func(t *testing.T) { e.PushAccounts(t) }
		r.url, r.nodes = e.URL, []string{e.URL}
		adminNC = e.Connect(t)
	}
	ctx := testCtx(t)
	var err error
	if r.admin, err = broker.Provision(ctx, adminNC, broker.Config{}); err != nil {
		t.Fatal(err)
	}
	if err := auth.PublishGrants(ctx, r.admin.JS, setup, 0); err != nil {
		t.Fatal(err)
	}
	r.startWorker(t)
	return r
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func (r *rig) startWorker(t *testing.T) {
	t.Helper()
	t.Cleanup(r.startStoppableWorker(t))
}

// startStoppableWorker starts the rig's worker and returns what stops it
// (once; later calls do nothing).
func (r *rig) startStoppableWorker(t *testing.T) (stop func()) {
	t.Helper()
	echo := executor.Define("t.echo", executor.Meta{
		Description: "Echoes.", Expose: executor.On(executor.SurfaceDirect, executor.SurfaceMCP), SideEffect: executor.SideEffectNone,
	}, func(ctx context.Context, c executor.Call[Echo]) (Echo, error) { return c.Input, nil })
	send := executor.Define("t.send", executor.Meta{
		Description: "Sends, once.", Expose: executor.On(executor.SurfaceDirect), SideEffect: executor.SideEffectExternal,
		// A held send runs until cancelled: the default 30 s ended it
		// during a scene on a loaded machine, and the world changed.
		Timeout: 10 * time.Minute,
	}, func(ctx context.Context, c executor.Call[Echo]) (string, error) {
		r.sends.Add(1)
		if c.Input.Text == "hold" {
			<-ctx.Done() // until cancelled
			return "", ctx.Err()
		}
		return "sent", nil
	})
	refund := executor.Define("t.refund", executor.Meta{
		Description: "Refunds.", Expose: executor.On(executor.SurfaceDirect), SideEffect: executor.SideEffectWrite,
		Policies: []executor.Policy{{Name: "finance", Evaluate: func(ctx context.Context, p executor.PolicyRequest) (executor.Decision, error) {
			return executor.Decision{Stance: executor.StanceRequireApproval, Reason: "refunds need finance", ApprovalTypes: []string{"finance"}}, nil
		}}},
	}, func(ctx context.Context, c executor.Call[Refund]) (string, error) {
		r.refunds.Add(1)
		return fmt.Sprintf("refunded %d", c.Input.Amount), nil
	})
	// t.report reports its progress, naming its input, and holds until
	// the test lets it end.
	if r.reported == nil {
		r.reported = make(chan struct{})
		t.Cleanup(func() { r.reportedOnce.Do(func() { close(r.reported) }) })
	}
	report := executor.Define("t.report", executor.Meta{
		Description: "Reports its progress.", Expose: executor.On(executor.SurfaceDirect), SideEffect: executor.SideEffectNone,
	}, func(ctx context.Context, c executor.Call[Echo]) (string, error) {
		c.Progress(1, 2, "progress of "+c.Input.Text)
		select {
		case <-r.reported:
		case <-ctx.Done():
			return "", ctx.Err()
		}
		return "reported", nil
	})
	reg, err := executor.NewRegistry(echo, send, refund, report)
	if err != nil {
		t.Fatal(err)
	}
	// Nothing of the worker's own writes while a test compares the state
	// before and after an attack: no catalog renewal, no lease renewal of
	// a held execution, no sweep.
	return capstantest.Worker(t, reg, capstantest.WithConn(r.connect(t, auth.WorkerPrincipal)),
		capstantest.WithConfig(testhooks.Worker(executor.WorkerConfig{Pool: "forge",
			CatalogTTL: time.Hour, Lease: 10 * time.Minute, SweepInterval: -1, Grace: time.Second}, r.knobs))).Stop
}

// client returns principal's client and a collector of the server's refusals.
func (r *rig) client(t *testing.T, principal string, surface executor.Surface) (*executor.Client, *nats.Conn, *violations) {
	t.Helper()
	v := newViolations()
	nc := r.connect(t, principal, v.handler())
	c, err := executor.NewClient(nc, executor.ClientConfig{Surface: surface,
		Actor: envelope.Actor{Kind: envelope.ActorUser, ID: principal}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c, nc, v
}

// snapshot is the whole state an attack must not change: every stream's and
// every key of every bucket (see world).
func (r *rig) snapshot(t *testing.T) world { return r.world(t) }

// settled waits until principal's execution id has its envelope and its
// trail its terminal event: nothing of the execution changes after both, and
// a snapshot taken before would see it change (the trail is published
// asynchronously, beside the envelope).
func (r *rig) settled(t *testing.T, principal, id string) {
	t.Helper()
	ctx := testCtx(t)
	for {
		_, _, err := broker.Load[envelope.Envelope](ctx, r.admin.Envelopes, broker.Key(principal, id))
		if err == nil && hasTerminalEvent(ctx, r.admin, principal, id) {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("execution %s never settled: envelope %v", id, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// acked waits until the exec stream holds no request of principal's among
// ids (with no ids: none of principal's at all). The ack of a request
// follows its envelope, and a world read between them would see the stream
// shrink.
func (r *rig) acked(t *testing.T, principal string, ids ...string) {
	t.Helper()
	ctx := testCtx(t)
	for {
		left, err := r.queued(ctx, principal)
		if err == nil && !slices.ContainsFunc(left, func(id string) bool { return len(ids) == 0 || slices.Contains(ids, id) }) {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s's requests never all acknowledged: %v, left %v", principal, err, left)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// queued lists the execution ids of principal's requests its queue still
// holds.
func (r *rig) queued(ctx context.Context, principal string) ([]string, error) {
	n := broker.NewNames(r.setup.Prefix)
	s, err := r.admin.JS.Stream(ctx, n.QueueStream(principal))
	if err != nil {
		return nil, err
	}
	subject := n.ExecSubject(principal, ">")
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		return nil, err
	}
	if len(info.State.Subjects) == 0 {
		return nil, nil
	}
	// Read one by one, the next of the subject from each sequence on: a
	// consumer on the work queue would take them from the workers.
	var ids []string
	for seq := info.State.FirstSeq; ; {
		m, err := s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return ids, nil
		}
		if err != nil {
			return ids, err
		}
		if req, err := envelope.DecodeRequest(m.Data); err == nil {
			ids = append(ids, req.ExecutionID)
		}
		seq = m.Sequence + 1
	}
}

// readTrail reads the trail of the execution id of the one principal that
// has an execution of that id.
func readTrail(ctx context.Context, b *broker.Broker, id string) ([]audit.Event, error) {
	owners, err := broker.Owners(ctx, b, id)
	if err != nil {
		return nil, err
	}
	if len(owners) != 1 {
		return nil, fmt.Errorf("%w: execution %s has owners %v", broker.ErrNotFound, id, owners)
	}
	return audit.Read(ctx, b.NC, b.Names.Prefix(), owners[0], id)
}

// hasTerminalEvent reports whether id's trail holds the event that ends it.
func hasTerminalEvent(ctx context.Context, b *broker.Broker, principal, id string) bool {
	trail, err := audit.Read(ctx, b.NC, b.Names.Prefix(), principal, id)
	if err != nil {
		return false
	}
	for _, ev := range trail {
		switch ev.Type {
		case audit.EventCompleted, audit.EventFailed, audit.EventCancelled, audit.EventApprovalRequested:
			return true
		}
	}
	return false
}

func (r *rig) assertUnchanged(t *testing.T, before world) {
	t.Helper()
	r.assertWorldUnchanged(t, before)
	if t.Failed() {
		t.FailNow()
	}
}

// trail returns the event types of one execution's trail, waiting for want's
// last type (events are published asynchronously).
func (r *rig) trail(t *testing.T, executionID, last string) []string {
	t.Helper()
	return r.waitTrail(t, executionID, last, func() []string { return r.events(t, executionID) })
}

// trailOf is trail of principal's execution id.
func (r *rig) trailOf(t *testing.T, principal, executionID, last string) []string {
	t.Helper()
	return r.waitTrail(t, executionID, last, func() []string { return r.eventsOf(t, principal, executionID) })
}

func (r *rig) waitTrail(t *testing.T, executionID, last string, read func() []string) []string {
	t.Helper()
	ctx := testCtx(t)
	for {
		events := read()
		if len(events) > 0 && events[len(events)-1] == last {
			return events
		}
		select {
		case <-ctx.Done():
			t.Fatalf("trail of %s never ended with %s: %v", executionID, last, read())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (r *rig) events(t *testing.T, executionID string) []string {
	t.Helper()
	return eventTypes(t, func(ctx context.Context) ([]audit.Event, error) { return readTrail(ctx, r.admin, executionID) })
}

// eventsOf returns the event types of principal's execution id.
func (r *rig) eventsOf(t *testing.T, principal, executionID string) []string {
	t.Helper()
	return eventTypes(t, func(ctx context.Context) ([]audit.Event, error) {
		return audit.Read(ctx, r.admin.NC, r.admin.Names.Prefix(), principal, executionID)
	})
}

func eventTypes(t *testing.T, read func(context.Context) ([]audit.Event, error)) []string {
	t.Helper()
	events, err := read(testCtx(t))
	if errors.Is(err, broker.ErrNotFound) {
		return nil // no event stored yet
	}
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range events {
		out = append(out, e.Type)
	}
	return out
}

func TestForge_ActorFromTheBodyIsRefused(t *testing.T) {
	t.Parallel()
	r := newRig(t, false)
	alice, _, _ := r.client(t, "alice", executor.SurfaceDirect)
	bob := envelope.Actor{Kind: envelope.ActorUser, ID: "bob"}
	env, err := alice.Call(testCtx(t), "t.send", Echo{Text: "as bob"}, executor.As(bob))
	if err != nil {
		t.Fatal(err)
	}
	if env.Status != envelope.StatusFailed || env.Error.Code != envelope.CodeForbidden || env.Error.Stage != envelope.StageActor {
		t.Fatalf("envelope %s %+v, want FORBIDDEN at stage actor", env.Status, env.Error)
	}
	if n := r.sends.Load(); n != 0 {
		t.Fatalf("the handler ran %d times", n)
	}
	events := r.trail(t, env.ExecutionID, "capability.failed")
	if !slices.Contains(events, "capability.denied") || slices.Contains(events, "capability.started") {
		t.Fatalf("trail %v", events)
	}
	// The trail says who and why: the principal, and the right it lacks.
	trail, err := readTrail(testCtx(t), r.admin, env.ExecutionID)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range trail {
		if e.Principal != "alice" {
			t.Fatalf("event %s names principal %q", e.Type, e.Principal)
		}
		if reason, _ := e.Data["reason"].(string); e.Type == "capability.denied" && !strings.Contains(reason, `may not act as user:bob`) {
			t.Fatalf("denied for %q", reason)
		}
	}
}

func TestForge_SurfaceFromTheBodyIsRefused(t *testing.T) {
	t.Parallel()
	r := newRig(t, false)
	// alice may call from direct only; her client says mcp.
	alice, _, _ := r.client(t, "alice", executor.SurfaceMCP)
	env, err := alice.Call(testCtx(t), "t.echo", Echo{Text: "hi"})
	if err != nil {
		t.Fatal(err)
	}
	if env.Error == nil || env.Error.Code != envelope.CodeForbidden {
		t.Fatalf("envelope %s %+v, want FORBIDDEN", env.Status, env.Error)
	}
	if events := r.trail(t, env.ExecutionID, "capability.failed"); !slices.Contains(events, "capability.denied") {
		t.Fatalf("trail %v", events)
	}
}

func TestForge_ProducerCannotDecideApprovals(t *testing.T) {
	t.Parallel()
	r := newRig(t, false)
	alice, aliceNC, v := r.client(t, "alice", executor.SurfaceDirect)
	env, err := alice.Call(testCtx(t), "t.refund", Refund{OrderID: "o1", Amount: 900})
	if err != nil {
		t.Fatal(err)
	}
	if env.Status != envelope.StatusApprovalRequired {
		t.Fatalf("envelope %s %+v", env.Status, env.Error)
	}
	r.trail(t, env.ExecutionID, "capability.approval_requested")
	r.settled(t, "alice", env.ExecutionID)
	before := r.snapshot(t)
	ctx := testCtx(t)

	// 1. The decision request, whatever approver it names: the server refuses
	// to carry it (alice may not publish on any decide subject).
	short, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, err = approvalsrpc.Decide(short, aliceNC, broker.NewNames(r.setup.Prefix), approvalsrpc.DecideRequest{
		ApprovalID: env.Approval.ID, Approve: true, Approver: envelope.Actor{Kind: "user", ID: "anyone"}})
	if err == nil {
		t.Fatal("alice's decision was answered")
	}
	v.wait(t, ctx, broker.NewNames(r.setup.Prefix).DecideSubject("alice"))
	for _, p := range []string{"carol", auth.WorkerPrincipal} {
		if err := aliceNC.Publish(broker.NewNames(r.setup.Prefix).DecideSubject(p), []byte{}); err != nil {
			t.Fatal(err)
		}
		v.wait(t, ctx, broker.NewNames(r.setup.Prefix).DecideSubject(p))
	}
	// 2. Deciding through the store writes the bucket directly: refused.
	_, err = alice.Decide(short, env.Approval.ID, approvals.Verdict{Approve: true,
		Approver: envelope.Actor{Kind: "user", ID: "anyone"}})
	if err == nil {
		t.Fatal("alice decided through the bucket")
	}
	// 3. Minting an approved record from nothing, or resetting one: refused.
	minted := map[string]any{"v": 1, "id": envelope.NewExecutionID(), "capabilityId": "t.refund", "status": "approved"}
	b, _ := envelope.Marshal(minted)
	for _, key := range []string{minted["id"].(string), env.Approval.ID} {
		subject := "$KV." + broker.NewNames(r.setup.Prefix).ApprovalsBucket() + "." + key
		if err := aliceNC.Publish(subject, b); err != nil {
			t.Fatal(err)
		}
		v.wait(t, ctx, subject)
	}
	r.assertUnchanged(t, before)
	rec, err := approvalstore.NewStore(r.admin.Approvals, nil).Get(ctx, env.Approval.ID)
	if err != nil || rec.Status != approvals.StatusPending {
		t.Fatalf("approval %+v, %v", rec, err)
	}
	if n := r.refunds.Load(); n != 0 {
		t.Fatalf("refund ran %d times", n)
	}
}

// The approvals flow with two principals: alice requests, carol decides, alice
// resumes; a consumed approval cannot be reset to run twice.
func TestForge_ConsumedApprovalCannotBeReset(t *testing.T) {
	t.Parallel()
	r := newRig(t, false)
	ctx := testCtx(t)
	alice, aliceNC, v := r.client(t, "alice", executor.SurfaceDirect)
	env, err := alice.Call(ctx, "t.refund", Refund{OrderID: "o1", Amount: 900})
	if err != nil || env.Status != envelope.StatusApprovalRequired {
		t.Fatalf("%v %+v", err, env)
	}
	rec, err := approvalsrpc.Decide(ctx, r.connect(t, "carol"), broker.NewNames(r.setup.Prefix),
		approvalsrpc.DecideRequest{ApprovalID: env.Approval.ID, Approve: true})
	if err != nil {
		t.Fatal(err)
	}
	if rec.Decision.Approver.String() != "user:carol" {
		t.Fatalf("approver %s", rec.Decision.Approver)
	}
	done, err := alice.Resume(ctx, env.Approval.ID)
	if err != nil || done.Status != envelope.StatusCompleted {
		t.Fatalf("resume: %v %+v", err, done)
	}
	r.trail(t, done.ExecutionID, "capability.completed")
	r.settled(t, "alice", done.ExecutionID)
	before := r.snapshot(t)
	consumed, err := approvalstore.NewStore(r.admin.Approvals, nil).Get(ctx, env.Approval.ID)
	if err != nil {
		t.Fatal(err)
	}
	reset := *consumed
	reset.Status, reset.ConsumedBy = approvals.StatusApproved, ""
	b, _ := envelope.Marshal(&reset)
	subject := "$KV." + broker.NewNames(r.setup.Prefix).ApprovalsBucket() + "." + env.Approval.ID
	if err := aliceNC.Publish(subject, b); err != nil {
		t.Fatal(err)
	}
	v.wait(t, ctx, subject)
	r.assertUnchanged(t, before)
	again, err := alice.Resume(ctx, env.Approval.ID)
	if err != nil {
		t.Fatal(err)
	}
	if again.Error == nil || again.Error.Code != envelope.CodeApprovalConsumed {
		t.Fatalf("second resume %s %+v", again.Status, again.Error)
	}
	if n := r.refunds.Load(); n != 1 {
		t.Fatalf("refund ran %d times", n)
	}
	after, err := approvalstore.NewStore(r.admin.Approvals, nil).Get(ctx, env.Approval.ID)
	if err != nil || after.Status != approvals.StatusConsumed || after.ConsumedBy != done.ExecutionID {
		t.Fatalf("approval %+v, %v", after, err)
	}
}

func TestForge_EnvelopeCreatedBeforeTheWorkerIsRefused(t *testing.T) {
	t.Parallel()
	testEnvelopeForges(t, newRig(t, false))
}

func testEnvelopeForges(t *testing.T, r *rig) {
	ctx := testCtx(t)
	alice, aliceNC, v := r.client(t, "alice", executor.SurfaceDirect)
	n := broker.NewNames(r.setup.Prefix)
	id := envelope.NewExecutionID()
	forged, _ := envelope.Marshal(&envelope.Envelope{V: 1, ExecutionID: id, CapabilityID: "t.echo",
		Status: envelope.StatusCompleted, Output: envelope.MustRaw(Echo{Text: "forged"})})
	before := r.snapshot(t)
	// In the bucket, before the worker finalizes; and as a plain message where
	// the client listens.
	for _, subject := range []string{
		"$KV." + n.EnvelopesBucket() + "." + broker.Key("alice", id),
		n.EnvelopeSubjectsOf("alice")[:len(n.EnvelopeSubjectsOf("alice"))-1] + id,
	} {
		if err := aliceNC.Publish(subject, forged); err != nil {
			t.Fatal(err)
		}
		v.wait(t, ctx, subject)
	}
	r.assertUnchanged(t, before)
	env, err := alice.Call(ctx, "t.echo", Echo{Text: "real"}, executor.WithID(id))
	if err != nil {
		t.Fatal(err)
	}
	var out Echo
	if err := env.Output.Decode(&out); err != nil || out.Text != "real" {
		t.Fatalf("alice read %+v (%v), want the worker's result", out, err)
	}
	events := r.trail(t, id, "capability.completed")
	if slices.Contains(events, "envelope.conflict") {
		t.Fatalf("trail %v", events)
	}
}

func TestForge_AuditEventsAndPurgeAreRefused(t *testing.T) {
	t.Parallel()
	r := newRig(t, false)
	ctx := testCtx(t)
	alice, aliceNC, v := r.client(t, "alice", executor.SurfaceDirect)
	env, err := alice.Call(ctx, "t.echo", Echo{Text: "x"})
	if err != nil {
		t.Fatal(err)
	}
	r.trail(t, env.ExecutionID, "capability.completed")
	r.settled(t, "alice", env.ExecutionID)
	before := r.snapshot(t)
	n := broker.NewNames(r.setup.Prefix)
	fake, _ := envelope.Marshal(map[string]any{"type": "capability.completed", "executionId": env.ExecutionID})
	for _, subject := range []string{
		n.AuditSubject(env.ExecutionID),
		"$JS.API.STREAM.PURGE." + n.AuditStream(),
		"$JS.API.STREAM.MSG.DELETE." + n.AuditStream(),
		"$JS.API.STREAM.DELETE." + n.AuditStream(),
		"$JS.API.STREAM.UPDATE." + n.AuditStream(),
		// Nor does it read the trail, whose shards hold other principals'
		// executions too.
		"$JS.API.DIRECT.GET." + n.AuditStream(),
	} {
		if err := aliceNC.Publish(subject, fake); err != nil {
			t.Fatal(err)
		}
		v.wait(t, ctx, subject)
	}
	r.assertUnchanged(t, before)
}

func TestForge_DeletingRecordAndEnvelopeThenResubmittingRunsNothingTwice(t *testing.T) {
	t.Parallel()
	r := newRig(t, false)
	ctx := testCtx(t)
	alice, aliceNC, v := r.client(t, "alice", executor.SurfaceDirect)
	id := envelope.NewExecutionID()
	env, err := alice.Call(ctx, "t.send", Echo{Text: "once"}, executor.WithID(id))
	if err != nil || env.Status != envelope.StatusCompleted {
		t.Fatalf("%v %+v", err, env)
	}
	r.trail(t, id, "capability.completed")
	r.settled(t, "alice", id)
	before := r.snapshot(t)
	n := broker.NewNames(r.setup.Prefix)
	for _, bucket := range []string{n.ExecutionsBucket(), n.EnvelopesBucket()} {
		subject := "$KV." + bucket + "." + broker.Key("alice", id)
		if err := aliceNC.PublishMsg(&nats.Msg{Subject: subject, Header: nats.Header{"KV-Operation": []string{"PURGE"}}}); err != nil {
			t.Fatal(err)
		}
		v.wait(t, ctx, subject)
		purge := "$JS.API.STREAM.PURGE.KV_" + bucket
		if err := aliceNC.Publish(purge, nil); err != nil {
			t.Fatal(err)
		}
		v.wait(t, ctx, purge)
	}
	r.assertUnchanged(t, before)
	// Submitting the same execution again runs nothing.
	again, err := alice.Call(ctx, "t.send", Echo{Text: "once"}, executor.WithID(id))
	if err != nil {
		t.Fatal(err)
	}
	if again.FinalizedAt != env.FinalizedAt || r.sends.Load() != 1 {
		t.Fatalf("sent %d times; envelope %+v", r.sends.Load(), again)
	}
}

func TestForge_CancellingAnotherPrincipalsExecutionIsRefused(t *testing.T) {
	t.Parallel()
	r := newRig(t, false)
	ctx := testCtx(t)
	bob, _, _ := r.client(t, "bob", executor.SurfaceDirect)
	alice, aliceNC, v := r.client(t, "alice", executor.SurfaceDirect)
	id, err := bob.Submit(ctx, "t.send", Echo{Text: "hold"})
	if err != nil {
		t.Fatal(err)
	}
	r.trail(t, id, "capability.started")
	n := broker.NewNames(r.setup.Prefix)
	// On bob's cancel subject: the server refuses; on alice's own, for bob's id:
	// no execution of alice has that id.
	if err := aliceNC.Publish(n.CancelSubject("bob", id), nil); err != nil {
		t.Fatal(err)
	}
	v.wait(t, ctx, n.CancelSubject("bob", id))
	// Whatever the workers answer alice, it concerns alice's key space only;
	// naming bob as the owner is an admin's right.
	_, _ = alice.Cancel(ctx, id)
	if _, err := alice.Cancel(ctx, id, executor.OwnedBy("bob")); err == nil || !strings.Contains(err.Error(), "only an admin") {
		t.Fatalf("alice cancelling as bob's admin: %v", err)
	}
	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	if env, err := bob.Await(short, id); err == nil {
		t.Fatalf("bob's execution ended: %s %+v", env.Status, env.Error)
	}
	// bob cancels his own.
	if _, err := bob.Cancel(ctx, id); err != nil {
		t.Fatal(err)
	}
	env, err := bob.Await(ctx, id)
	if err != nil || env.Status != envelope.StatusCancelled {
		t.Fatalf("%v %+v", err, env)
	}
	// An admin cancels anyone's, naming the owner.
	other, err := bob.Submit(ctx, "t.send", Echo{Text: "hold"})
	if err != nil {
		t.Fatal(err)
	}
	r.trail(t, other, "capability.started")
	admin, _, _ := r.client(t, auth.AdminPrincipal, executor.SurfaceDirect)
	if _, err := admin.Cancel(ctx, other, executor.OwnedBy("bob")); err != nil {
		t.Fatal(err)
	}
	if env, err := bob.Await(ctx, other); err != nil || env.Status != envelope.StatusCancelled {
		t.Fatalf("%v %+v", err, env)
	}
	if s, err := admin.StatusOf(ctx, "bob", other); err != nil || s.Envelope == nil || s.Envelope.Status != envelope.StatusCancelled {
		t.Fatalf("the admin reads bob's execution: %v %+v", err, s)
	}
}

// A body naming another capability than its subject: the server let alice
// publish on t.echo's subject, the body asks for t.send.
func TestForge_BodyCapabilityDiffersFromSubjectIsRefused(t *testing.T) {
	t.Parallel()
	r := newRig(t, false)
	ctx := testCtx(t)
	dana, danaNC, _ := r.client(t, "dana", executor.SurfaceDirect)
	id := envelope.NewExecutionID()
	req := &envelope.Request{V: envelope.Version, ExecutionID: id, CapabilityID: "t.send",
		Input: envelope.MustRaw(Echo{Text: "x"}), Actor: envelope.Actor{Kind: "user", ID: "dana"},
		Surface: string(executor.SurfaceDirect), SubmittedAt: time.Now().UTC()}
	b, err := envelope.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(danaNC)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, broker.NewNames(r.setup.Prefix).ExecSubject("dana", "t.echo"), b, jetstream.WithMsgID(id)); err != nil {
		t.Fatal(err)
	}
	env, err := dana.Await(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if env.Error == nil || env.Error.Code != envelope.CodeForbidden || r.sends.Load() != 0 {
		t.Fatalf("envelope %s %+v, sent %d", env.Status, env.Error, r.sends.Load())
	}
	if events := r.trail(t, id, "capability.failed"); slices.Contains(events, "capability.started") {
		t.Fatalf("trail %v", events)
	}
}

// Describe lists what the principal may call, for actors it may assert.
func TestForge_DescribeKeepsToTheGrant(t *testing.T) {
	t.Parallel()
	r := newRig(t, false)
	ctx := testCtx(t)
	dana, _, _ := r.client(t, "dana", executor.SurfaceDirect)
	d, err := dana.Describe(ctx, executor.SurfaceDirect, envelope.Actor{Kind: "user", ID: "dana"}, executor.Scope{})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, c := range d.Capabilities {
		ids = append(ids, c.ID)
	}
	if !slices.Equal(ids, []string{"t.echo"}) {
		t.Fatalf("dana sees %v, want [t.echo]", ids)
	}
	_, err = dana.Describe(ctx, executor.SurfaceDirect, envelope.Actor{Kind: "user", ID: "bob"}, executor.Scope{})
	var ce *envelope.CapabilityError
	if !errors.As(err, &ce) || ce.Code != envelope.CodeForbidden {
		t.Fatalf("dana describing as bob: %v", err)
	}
}

func TestForge_ProducerReceivesAndReadsOnlyItsOwnResults(t *testing.T) {
	t.Parallel()
	r := newRig(t, false)
	ctx := testCtx(t)
	bob, _, _ := r.client(t, "bob", executor.SurfaceDirect)
	_, aliceNC, v := r.client(t, "alice", executor.SurfaceDirect)
	n := broker.NewNames(r.setup.Prefix)
	if _, err := aliceNC.SubscribeSync(n.EnvelopeSubjects()); err != nil {
		t.Fatal(err)
	}
	v.wait(t, ctx, n.EnvelopeSubjects())
	if _, err := aliceNC.SubscribeSync(n.EnvelopeSubjectsOf("bob")); err != nil {
		t.Fatal(err)
	}
	v.wait(t, ctx, n.EnvelopeSubjectsOf("bob"))
	env, err := bob.Call(ctx, "t.echo", Echo{Text: "bob's secret"})
	if err != nil || env.Status != envelope.StatusCompleted {
		t.Fatalf("%v %+v", err, env)
	}
	// As a client reads: by key, without the buckets' stream information,
	// which a producer may not ask for.
	ab, err := broker.Open(ctx, aliceNC, broker.Config{Prefix: r.setup.Prefix})
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range []jetstream.KeyValue{ab.Envelopes, ab.Executions} {
		bucket := kv.Bucket()
		short, cancel := context.WithTimeout(ctx, time.Second)
		_, err = kv.Get(short, broker.Key("bob", env.ExecutionID))
		cancel()
		if err == nil || errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Fatalf("alice's read of bob's %s: %v, want a refusal", bucket, err)
		}
		v.wait(t, ctx, "$KV."+bucket+"."+broker.Key("bob", env.ExecutionID))
	}
}

func TestForgeOnCluster_ApprovalsAndEnvelopes(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("3-node cluster")
	}
	r := newRig(t, true)
	t.Run("envelopes", func(t *testing.T) { testEnvelopeForges(t, r) })
	t.Run("approvals", func(t *testing.T) {
		ctx := testCtx(t)
		alice, aliceNC, v := r.client(t, "alice", executor.SurfaceDirect)
		env, err := alice.Call(ctx, "t.refund", Refund{OrderID: "o2", Amount: 900})
		if err != nil || env.Status != envelope.StatusApprovalRequired {
			t.Fatalf("%v %+v", err, env)
		}
		r.trail(t, env.ExecutionID, "capability.approval_requested")
		r.settled(t, "alice", env.ExecutionID)
		before := r.snapshot(t)
		n := broker.NewNames(r.setup.Prefix)
		subject := "$KV." + n.ApprovalsBucket() + "." + env.Approval.ID
		if err := aliceNC.Publish(subject, []byte("approved")); err != nil {
			t.Fatal(err)
		}
		v.wait(t, ctx, subject)
		if err := aliceNC.Publish(n.DecideSubject("alice"), nil); err != nil {
			t.Fatal(err)
		}
		v.wait(t, ctx, n.DecideSubject("alice"))
		r.assertUnchanged(t, before)
		// carol decides; alice resumes once.
		if _, err := approvalsrpc.Decide(ctx, r.connect(t, "carol"), n,
			approvalsrpc.DecideRequest{ApprovalID: env.Approval.ID, Approve: true}); err != nil {
			t.Fatal(err)
		}
		done, err := alice.Resume(ctx, env.Approval.ID)
		if err != nil || done.Status != envelope.StatusCompleted {
			t.Fatalf("%v %+v", err, done)
		}
	})
}

// The server sends a reply wherever a requester says: a direct get of alice's
// own envelope, answered on bob's envelope subject, must not pass for the
// result bob waits for; nor may a worker answer on another principal's subject.
func TestForge_RepliesAimedAtAnotherPrincipalAreNotResults(t *testing.T) {
	t.Parallel()
	r := newRig(t, false)
	ctx := testCtx(t)
	bob, _, _ := r.client(t, "bob", executor.SurfaceDirect)
	alice, aliceNC, _ := r.client(t, "alice", executor.SurfaceDirect)
	mine, err := alice.Call(ctx, "t.echo", Echo{Text: "alice's"})
	if err != nil || mine.Status != envelope.StatusCompleted {
		t.Fatalf("%v %+v", err, mine)
	}
	// bob waits for his call: its waiter exists once the call started.
	id := envelope.NewExecutionID()
	type result struct {
		env *envelope.Envelope
		err error
	}
	got := make(chan result, 1)
	go func() {
		env, err := bob.Call(ctx, "t.send", Echo{Text: "hold"}, executor.WithID(id))
		got <- result{env, err}
	}()
	r.trail(t, id, "capability.started")
	n := broker.NewNames(r.setup.Prefix)
	bobs := n.EnvelopeSubjectsOf("bob")[:len(n.EnvelopeSubjectsOf("bob"))-1] + id
	get := "$JS.API.DIRECT.GET.KV_" + n.EnvelopesBucket() + ".$KV." + n.EnvelopesBucket() + "." + broker.Key("alice", mine.ExecutionID)
	if err := aliceNC.PublishRequest(get, bobs, nil); err != nil {
		t.Fatal(err)
	}
	// A describe of alice's answered on bob's subject: the workers do not answer.
	if err := aliceNC.PublishRequest(n.DescribeSubject("alice"), bobs, []byte{0x80}); err != nil {
		t.Fatal(err)
	}
	if err := aliceNC.Flush(); err != nil {
		t.Fatal(err)
	}
	// The forged answers had their chance while bob's execution still ran:
	// alice's own call's envelope, fetched afresh, proves hers arrived.
	if _, err := alice.Await(ctx, mine.ExecutionID); err != nil {
		t.Fatal(err)
	}
	select {
	case res := <-got:
		t.Fatalf("bob's call returned %+v, %v while it ran", res.env, res.err)
	case <-time.After(time.Second):
	}
	if _, err := bob.Cancel(ctx, id); err != nil {
		t.Fatal(err)
	}
	res := <-got
	if res.err != nil || res.env.Status != envelope.StatusCancelled || res.env.ExecutionID != id {
		t.Fatalf("%v %+v", res.err, res.env)
	}
}
