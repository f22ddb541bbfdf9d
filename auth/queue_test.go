package auth_test

import (
	"context"
	"encoding/json"
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

	"github.com/capstan-dev/capstan/auth"
	"github.com/capstan-dev/capstan/capstantest"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// Each principal's requests wait in a queue of its own (DESIGN §3): alice's
// backlog, her quotas and what she parks there cost alice alone. Every test
// here runs with alice's and bob's real credentials, on the embedded server
// and on the official nats-server running the generated configuration.

func onEachServer(t *testing.T, test func(t *testing.T, r *rig)) {
	t.Helper()
	for _, d := range []deployment{embedded, official} {
		t.Run(d.String(), func(t *testing.T) {
			t.Parallel()
			test(t, newRigOn(t, d))
		})
	}
}

// A principal's backlog delays that principal alone: with a thousand of
// alice's requests queued while no worker serves them, bob's one request,
// queued after them all, is among the first a worker starts once it comes
// (first in, first out across principals would start it 1,001st). The test
// reads the order handlers start in; it times nothing.
func TestQueue_ABacklogDelaysOnlyItsPrincipal(t *testing.T) {
	t.Parallel()
	onEachServer(t, testBacklogDelaysOnlyItsPrincipal)
}

func testBacklogDelaysOnlyItsPrincipal(t *testing.T, r *rig) {
	const (
		backlog     = 1000
		concurrency = 2
		// Once bob's loop holds his request it waits behind at most one
		// delivery of alice's; before it holds it, a worker that just
		// started may have given alice its free slots and the next few
		// deliveries her first pull brought.
		within = 2*concurrency + 4
	)
	ctx := testCtx(t)
	var mu sync.Mutex
	var started []string
	order := executor.Define("t.order", executor.Meta{
		Description: "Records whose call starts when.", Expose: executor.On(executor.SurfaceDirect), SideEffect: executor.SideEffectNone,
	}, func(ctx context.Context, c executor.Call[Echo]) (Echo, error) {
		mu.Lock()
		started = append(started, c.Actor.ID)
		mu.Unlock()
		return c.Input, nil
	})
	reg, err := executor.NewRegistry(order)
	if err != nil {
		t.Fatal(err)
	}
	cfg := executor.WorkerConfig{Pool: "fair", Concurrency: concurrency, SweepInterval: -1, CatalogTTL: time.Hour, Grace: time.Second}
	// Listed, then stopped: requests wait in the queues for the pool.
	capstantest.Worker(t, reg, capstantest.WithConn(r.connect(t, auth.WorkerPrincipal)), capstantest.WithConfig(cfg)).Stop()

	alice, _, _ := r.client(t, "alice", executor.SurfaceDirect)
	bob, _, _ := r.client(t, "bob", executor.SurfaceDirect)
	var wg sync.WaitGroup
	errs := make(chan error, backlog)
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < backlog; i += 4 {
				if _, err := alice.Submit(ctx, "t.order", Echo{Text: fmt.Sprint(i)}); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("alice's backlog: %v", err)
	}
	bobID, err := bob.Submit(ctx, "t.order", Echo{Text: "bob's"})
	if err != nil {
		t.Fatal(err)
	}
	// As alice's client reads it from the workers, and as the server holds it.
	u, err := alice.Queue(ctx)
	if err != nil || u.Requests != backlog || u.MaxRequests != auth.DefaultQuotas.QueuedRequests {
		t.Fatalf("alice's queue: %v %+v, want her backlog of %d within her default quota", err, u, backlog)
	}
	if got := r.queueDepth(t, "alice"); got != backlog {
		t.Fatalf("alice's queue holds %d requests, want her backlog of %d", got, backlog)
	}

	capstantest.Worker(t, reg, capstantest.WithConn(r.connect(t, auth.WorkerPrincipal)), capstantest.WithConfig(cfg))
	env, err := bob.Await(ctx, bobID)
	if err != nil || env.Status != envelope.StatusCompleted {
		t.Fatalf("bob's call: %v %+v", err, env)
	}
	mu.Lock()
	defer mu.Unlock()
	at := slices.Index(started, "bob")
	t.Logf("bob's call started %d of %d started so far", at+1, len(started))
	if at < 0 || at >= within {
		t.Fatalf("bob's call started %d of %d started so far, want among the first %d: alice's backlog stood in front of it", at+1, len(started), within)
	}
}

// queueDepth reads how many requests principal's queue holds, as an admin.
func (r *rig) queueDepth(t *testing.T, principal string) uint64 {
	t.Helper()
	s, err := r.admin.JS.Stream(testCtx(t), broker.NewNames(r.setup.Prefix).QueueStream(principal))
	if err != nil {
		t.Fatal(err)
	}
	return s.CachedInfo().State.Msgs
}

// setQuotas changes principal's quotas as `capstan auth set` and `auth push`
// do, while the worker runs.
func (r *rig) setQuotas(t *testing.T, principal string, change func(q *auth.Quotas)) {
	t.Helper()
	g, ok := r.setup.Grant(principal)
	if !ok {
		t.Fatalf("no grant of %s", principal)
	}
	q := g.Quotas.OrDefault()
	change(&q)
	if err := r.setup.Set(principal, nil, &q); err != nil {
		t.Fatal(err)
	}
	if err := auth.PublishGrants(testCtx(t), r.admin.JS, r.setup, 0); err != nil {
		t.Fatal(err)
	}
}

// bobCalls makes one call of bob's, which must complete, and waits until it
// left his queue.
func (r *rig) bobCalls(t *testing.T, bob *executor.Client, input Echo) {
	t.Helper()
	if env, err := bob.Call(testCtx(t), "t.echo", input); err != nil || env.Status != envelope.StatusCompleted {
		t.Fatalf("bob's call %q: %v %+v", input.Text, err, env)
	}
	r.acked(t, "bob")
}

// bobsWorld is what of the world is bob's: his queue, his records and
// envelopes.
func (r *rig) bobsWorld(t *testing.T) world {
	t.Helper()
	n := broker.NewNames(r.setup.Prefix)
	all := r.world(t)
	w := world{streams: map[string]streamState{n.QueueStream("bob"): all.streams[n.QueueStream("bob")]}, keys: map[string]uint64{}}
	for k, rev := range all.keys {
		bucket, key, _ := strings.Cut(k, "/")
		if (bucket == n.ExecutionsBucket() || bucket == n.EnvelopesBucket()) && strings.HasPrefix(key, "bob.") {
			w.keys[k] = rev
		}
	}
	return w
}

// Over her queue quotas, alice is refused at the door: her publication is
// refused by the server, and her clients answer QUOTA_EXCEEDED naming the
// quota and its limit (a call as an envelope never stored, which a model
// sees with its details), for requests and for bytes; a request she sent to
// the unrouted subject that her full queue would not take back is ended so by
// the worker. Quotas changed by auth set and a push take effect at once,
// with no worker restarted. bob's calls keep answering, and nothing of his
// changes.
func TestQueue_OverItsQuotaAPrincipalIsRefusedAtTheDoor(t *testing.T) {
	t.Parallel()
	onEachServer(t, testRefusedAtTheDoor)
}

func testRefusedAtTheDoor(t *testing.T, r *rig) {
	ctx := testCtx(t)
	n := broker.NewNames(r.setup.Prefix)
	r.setQuotas(t, "alice", func(q *auth.Quotas) { q.QueuedRequests = 3 })
	alice, aliceNC, _ := r.client(t, "alice", executor.SurfaceDirect)
	bob, _, _ := r.client(t, "bob", executor.SurfaceDirect)
	r.bobCalls(t, bob, Echo{Text: "bob's, before"})
	bobBefore := r.bobsWorld(t)

	// Two held calls wait in alice's queue (running, not yet ended).
	for range 2 {
		if _, err := alice.Submit(ctx, "t.send", Echo{Text: "hold"}); err != nil {
			t.Fatal(err)
		}
	}
	// The third, sent to the unrouted subject, takes the last place: the
	// worker's forward to its capability's subject finds the queue full,
	// and ends it.
	unrouted := envelope.NewExecutionID()
	publishUnrouted(t, aliceNC, "alice", "t.echo", unrouted)
	env, err := alice.Await(ctx, unrouted)
	if err != nil || env.Error == nil || env.Error.Code != envelope.CodeQuotaExceeded || env.Error.Details["quota"] != envelope.QuotaQueuedRequests {
		t.Fatalf("alice's unrouted request, forwarded into her full queue: %v %+v", err, env)
	}
	// Acknowledged after its envelope, the unrouted request leaves its place.
	for r.queueDepth(t, "alice") != 2 {
		select {
		case <-ctx.Done():
			t.Fatalf("alice's queue holds %d requests, want her 2 held ones", r.queueDepth(t, "alice"))
		case <-time.After(20 * time.Millisecond):
		}
	}
	if _, err := alice.Submit(ctx, "t.send", Echo{Text: "hold"}); err != nil {
		t.Fatal(err)
	}
	queue := r.queueLength(t, "alice")

	// Over: refused before anything is stored.
	_, err = alice.Submit(ctx, "t.echo", Echo{Text: "one too many"})
	var cerr *envelope.CapabilityError
	if !errors.As(err, &cerr) || cerr.Code != envelope.CodeQuotaExceeded || !errors.Is(err, broker.ErrQueueFull) {
		t.Fatalf("alice's submit over her quota: %v", err)
	}
	if cerr.Details["quota"] != envelope.QuotaQueuedRequests || fmt.Sprint(cerr.Details["limit"]) != "3" || !cerr.Retryable {
		t.Fatalf("refusal: %+v", cerr)
	}
	env, err = alice.Call(ctx, "t.echo", Echo{Text: "one too many, called"})
	if err != nil || env.Status != envelope.StatusFailed || env.Error.Code != envelope.CodeQuotaExceeded {
		t.Fatalf("alice's call over her quota: %v %+v", err, env)
	}
	if m := env.ForModel(); m.Code != envelope.CodeQuotaExceeded || m.Details["quota"] != envelope.QuotaQueuedRequests || fmt.Sprint(m.Details["limit"]) != "3" {
		t.Fatalf("what a model sees: %+v", m)
	}
	if _, err := r.admin.Envelopes.Get(ctx, broker.Key("alice", env.ExecutionID)); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("a refused call's envelope was stored: %v", err)
	}
	if got := r.queueLength(t, "alice"); got != queue {
		t.Fatalf("alice's queue after her refusals: %+v, before %+v", got, queue)
	}

	// bob is served meanwhile, and nothing of his changed.
	r.bobCalls(t, bob, Echo{Text: "bob's, while alice is over"})
	bobAfter := r.bobsWorld(t)
	if bobAfter.streams[n.QueueStream("bob")].Msgs != 0 {
		t.Fatalf("bob's queue holds %+v", bobAfter.streams[n.QueueStream("bob")])
	}
	for k, rev := range bobBefore.keys {
		if bobAfter.keys[k] != rev {
			t.Errorf("bob's %s changed: revision %d, before %d", k, bobAfter.keys[k], rev)
		}
	}

	// Her quota raised (auth set, auth push): the next call is taken at
	// once, with no worker restarted.
	r.setQuotas(t, "alice", func(q *auth.Quotas) { q.QueuedRequests = 10 })
	if env, err := alice.Call(ctx, "t.echo", Echo{Text: "within the new quota"}); err != nil || env.Status != envelope.StatusCompleted {
		t.Fatalf("alice's call within her raised quota: %v %+v", err, env)
	}

	// Bytes: a quota of 4 KiB, which her three held calls and one more
	// large input exceed.
	r.setQuotas(t, "alice", func(q *auth.Quotas) { q.QueuedBytes = 4 << 10 })
	big := Echo{Text: strings.Repeat("x", 3<<10)}
	_, err = alice.Submit(ctx, "t.echo", big)
	if !errors.As(err, &cerr) || cerr.Code != envelope.CodeQuotaExceeded || cerr.Details["quota"] != envelope.QuotaQueuedBytes ||
		fmt.Sprint(cerr.Details["limit"]) != fmt.Sprint(4<<10) {
		t.Fatalf("alice's submit over her bytes quota: %v", err)
	}
	if env, err := bob.Call(ctx, "t.echo", big); err != nil || env.Status != envelope.StatusCompleted {
		t.Fatalf("bob's large call while alice is over her bytes: %v %+v", err, env)
	}
}

// queueLength is the stored span of principal's queue: a publication
// refused leaves it as it was.
func (r *rig) queueLength(t *testing.T, principal string) streamState {
	t.Helper()
	s, err := r.admin.JS.Stream(testCtx(t), broker.NewNames(r.setup.Prefix).QueueStream(principal))
	if err != nil {
		t.Fatal(err)
	}
	st := s.CachedInfo().State
	return streamState{LastSeq: st.LastSeq}
}

// publishUnrouted publishes, as principal, a request for capabilityID on the
// unrouted subject, as a client whose catalog does not list it does.
func publishUnrouted(t *testing.T, nc *nats.Conn, principal, capabilityID, id string) {
	t.Helper()
	raw, err := envelope.NewRaw(Echo{Text: "unrouted"})
	if err != nil {
		t.Fatal(err)
	}
	body, err := envelope.Marshal(&envelope.Request{V: envelope.Version, ExecutionID: id, CapabilityID: capabilityID,
		Input: raw, Actor: envelope.Actor{Kind: envelope.ActorUser, ID: principal}, Surface: "direct"})
	if err != nil {
		t.Fatal(err)
	}
	m := nats.NewMsg(broker.NewNames("").UnroutedSubject(principal))
	m.Data = body
	m.Header.Set(nats.MsgIdHdr, broker.Key(principal, id))
	if _, err := broker.PublishAck(testCtx(t), nc, m); err != nil {
		t.Fatalf("publish as %s: %v", principal, err)
	}
}

// Nothing parks: what alice publishes on subjects no capability serves, or
// that does not decode, counts against her own queue while it is there, and
// is ended (an envelope, where its message id names an execution) and
// removed within a sweep; bob's calls answer meanwhile and nothing of his
// changes.
func TestQueue_NothingParks(t *testing.T) {
	t.Parallel()
	onEachServer(t, testNothingParks)
}

func testNothingParks(t *testing.T, r *rig) {
	ctx := testCtx(t)
	n := broker.NewNames(r.setup.Prefix)
	alice, aliceNC, _ := r.client(t, "alice", executor.SurfaceDirect)
	bob, _, _ := r.client(t, "bob", executor.SurfaceDirect)
	r.bobCalls(t, bob, Echo{Text: "bob's, before"})
	bobBefore := r.bobsWorld(t)

	const parked = 10
	var parkedIDs, undecodedIDs []string
	for i := range parked {
		id := envelope.NewExecutionID()
		parkedIDs = append(parkedIDs, id)
		// Subjects no capability serves, one of them no capability can
		// ever be named (not a key of the catalog).
		capID := fmt.Sprintf("demo.parked%d", i)
		if i == 0 {
			capID = "Demo!parked"
		}
		publishAs(t, aliceNC, "alice", capID, id, broker.Key("alice", id), Echo{Text: strings.Repeat("p", 10<<10)})
	}
	// Bodies that are no request: under a message id naming an
	// execution, or none; on a subject nobody serves, and on one the
	// worker serves.
	raw := func(subject, msgID string) {
		m := nats.NewMsg(subject)
		m.Data = []byte("not a request")
		if msgID != "" {
			m.Header.Set(nats.MsgIdHdr, msgID)
		}
		if _, err := broker.PublishAck(ctx, aliceNC, m); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3 {
		id := envelope.NewExecutionID()
		undecodedIDs = append(undecodedIDs, id)
		raw(n.ExecSubject("alice", fmt.Sprintf("demo.parked-undecodable%d", i)), broker.Key("alice", id))
	}
	raw(n.ExecSubject("alice", "demo.parked-anonymous"), "")
	served := envelope.NewExecutionID()
	raw(n.ExecSubject("alice", "t.echo"), broker.Key("alice", served))

	// While they are there, they are alice's: her queue holds them.
	if got := r.queueDepth(t, "alice"); got < parked+4 {
		t.Fatalf("alice's queue holds %d requests, want at least her %d parked ones", got, parked+4)
	}
	r.bobCalls(t, bob, Echo{Text: "bob's, while alice parks"})
	bobDuring := r.bobsWorld(t)

	// A worker that sweeps: within a pass, alice's queue is empty.
	idle := executor.Define("t.idle", executor.Meta{Description: "Idles.", Expose: executor.On(executor.SurfaceDirect),
		SideEffect: executor.SideEffectNone}, func(ctx context.Context, c executor.Call[Echo]) (Echo, error) { return c.Input, nil })
	reg, err := executor.NewRegistry(idle)
	if err != nil {
		t.Fatal(err)
	}
	sweeper := capstantest.Worker(t, reg, capstantest.WithConn(r.connect(t, auth.WorkerPrincipal)),
		capstantest.WithConfig(executor.WorkerConfig{Pool: "sweeps", SweepInterval: 200 * time.Millisecond, CatalogTTL: time.Hour, Grace: time.Second}))
	for r.queueDepth(t, "alice") > 0 {
		select {
		case <-ctx.Done():
			t.Fatalf("alice's queue still holds %d messages", r.queueDepth(t, "alice"))
		case <-time.After(50 * time.Millisecond):
		}
	}
	if sweeper.Worker.Stats().Swept < parked {
		t.Fatalf("the sweeper ended %d requests, want alice's %d parked ones at least", sweeper.Worker.Stats().Swept, parked)
	}
	for _, id := range parkedIDs {
		env, err := alice.Await(ctx, id)
		if err != nil || env.Status != envelope.StatusFailed || env.Error.Code != envelope.CodeCapabilityNotFound {
			t.Fatalf("parked request %s: %v %+v", id, err, env)
		}
	}
	for _, id := range append(undecodedIDs, served) {
		env, err := alice.Await(ctx, id)
		if err != nil || env.Status != envelope.StatusFailed || env.Error.Code != envelope.CodeInputInvalid {
			t.Fatalf("undecodable message %s: %v %+v", id, err, env)
		}
	}
	bobAfter := r.bobsWorld(t)
	if bobAfter.streams[n.QueueStream("bob")] != bobDuring.streams[n.QueueStream("bob")] {
		t.Errorf("bob's queue: %+v, before the sweep %+v", bobAfter.streams[n.QueueStream("bob")], bobDuring.streams[n.QueueStream("bob")])
	}
	for k, rev := range bobBefore.keys {
		if bobAfter.keys[k] != rev {
			t.Errorf("bob's %s changed: revision %d, before %d", k, bobAfter.keys[k], rev)
		}
	}
	if len(bobAfter.keys) != len(bobDuring.keys) {
		t.Errorf("bob's keys: %d after the sweep, %d before", len(bobAfter.keys), len(bobDuring.keys))
	}
}

// A deployment of an earlier version, its one exec stream holding requests,
// upgraded as docs/operations.md says: workers of this version first (they
// serve the shared stream as the earlier ones did), then a push of this
// version. Every request stored before the push is served, each once, as
// is every request after it, which goes to its principal's queue; a worker
// that ran across the push finds the new queues without a restart.
func TestQueue_UpgradeOfAStoredDeploymentKeepsItsRequests(t *testing.T) {
	t.Parallel()
	setup, err := auth.Init(t.TempDir(), "")
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range rigGrants {
		if err := setup.Add(g); err != nil {
			t.Fatal(err)
		}
	}
	env := testenv.Start(t, testenv.Auth(setup))
	ctx := testCtx(t)
	n := broker.NewNames(setup.Prefix)
	adminNC := env.Connect(t)
	js, err := jetstream.New(adminNC)
	if err != nil {
		t.Fatal(err)
	}
	// The exec stream as earlier versions made it, and their grants: no
	// queues.
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: n.ExecStream(), Subjects: []string{n.ExecSubjects()},
		Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage, Duplicates: broker.DefaultDedupWindow,
		MaxAge: broker.DefaultRecordTTL}); err != nil {
		t.Fatal(err)
	}
	b, err := broker.Provision(ctx, adminNC, broker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	grants, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: n.GrantsBucket(), History: 1, Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range setup.Principals {
		g.AccountJWT = ""
		body, err := json.Marshal(g)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := grants.Put(ctx, g.Principal, body); err != nil {
			t.Fatal(err)
		}
	}

	var echoes, sends atomic.Int64
	define := func(id string, count *atomic.Int64) *executor.Registry {
		reg, err := executor.NewRegistry(executor.Define(id, executor.Meta{Description: "Counts its calls.",
			Expose: executor.On(executor.SurfaceDirect), SideEffect: executor.SideEffectNone},
			func(ctx context.Context, c executor.Call[Echo]) (Echo, error) { count.Add(1); return c.Input, nil }))
		if err != nil {
			t.Fatal(err)
		}
		return reg
	}
	worker := func(pool string, reg *executor.Registry) *capstantest.Running {
		return capstantest.Worker(t, reg, capstantest.WithConn(env.ConnectAs(t, auth.WorkerPrincipal)),
			capstantest.WithConfig(executor.WorkerConfig{Pool: pool, CatalogTTL: time.Hour, SweepInterval: -1, Grace: time.Second}))
	}
	// Upgraded workers, before the push: one runs across it, the other is
	// stopped with requests waiting for it.
	worker("echoes", define("u.echo", &echoes))
	worker("sends", define("u.send", &sends)).Stop()
	alice, err := executor.NewClient(env.ConnectAs(t, "alice"), executor.ClientConfig{Actor: envelope.Actor{Kind: envelope.ActorUser, ID: "alice"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = alice.Close() })
	if env, err := alice.Call(ctx, "u.echo", Echo{Text: "before the push"}); err != nil || env.Status != envelope.StatusCompleted {
		t.Fatalf("alice's call before the push: %v %+v", err, env)
	}
	var ids []string
	for i := range 5 {
		id, err := alice.Submit(ctx, "u.send", Echo{Text: fmt.Sprint("before ", i)})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}

	// The push of this version.
	if err := auth.PublishGrants(ctx, b.JS, setup, 0); err != nil {
		t.Fatal(err)
	}
	shared, err := js.Stream(ctx, n.ExecStream())
	if err != nil {
		t.Fatal(err)
	}
	if s := shared.CachedInfo(); !slices.Equal(s.Config.Subjects, []string{n.QueueSubjects(broker.Anonymous)}) || s.State.Msgs != 5 {
		t.Fatalf("the shared stream after the push: subjects %v, %d requests", s.Config.Subjects, s.State.Msgs)
	}
	// The worker that ran across the push serves alice's queue.
	if env, err := alice.Call(ctx, "u.echo", Echo{Text: "after the push"}); err != nil || env.Status != envelope.StatusCompleted {
		t.Fatalf("alice's call after the push: %v %+v", err, env)
	}
	for i := range 3 {
		id, err := alice.Submit(ctx, "u.send", Echo{Text: fmt.Sprint("after ", i)})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	// The echo's ack is sent without waiting for it: its request may leave
	// the queue a moment after its envelope.
	waitFor(t, "alice's queue to hold her 3 requests after the push", func() bool {
		return streamMsgs(t, js, n.QueueStream("alice")) == 3
	})
	worker("sends", define("u.send", &sends))
	for _, id := range ids {
		if env, err := alice.Await(ctx, id); err != nil || env.Status != envelope.StatusCompleted {
			t.Fatalf("alice's %s: %v %+v", id, err, env)
		}
	}
	if echoes.Load() != 2 || sends.Load() != int64(len(ids)) {
		t.Fatalf("handlers ran %d echoes and %d sends, want 2 and %d: each once", echoes.Load(), sends.Load(), len(ids))
	}
}

// streamMsgs is how many messages stream holds.
func streamMsgs(t *testing.T, js jetstream.JetStream, stream string) uint64 {
	t.Helper()
	s, err := js.Stream(testCtx(t), stream)
	if err != nil {
		t.Fatal(err)
	}
	return s.CachedInfo().State.Msgs
}
