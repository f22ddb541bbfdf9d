package engine

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/auditemit"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/capstan-dev/capstan/observe"
	"github.com/nats-io/nats.go/jetstream"
)

// A delivery rig: one runner on its own embedded server serving the
// capability "test.op", whose requests the test publishes and hands to the
// runner one delivery at a time (Runner.handle, synchronously), so that each
// rule of a delivery's pass is seen on the records, envelopes and trail it
// leaves, without the executor package around it.

// testOp is the capability id a rig serves.
const testOp = "test.op"

// testCap is a capability of a rig: its handler, retry rule and admission
// are the test's.
type testCap struct {
	work func(ctx context.Context, a Attempt) (any, error)
	// retry is the retry rule; nil: never retried.
	retry func(n int, err *envelope.CapabilityError) (time.Duration, bool)
	// admit decides the admission; nil: admitted.
	admit     func(ctx context.Context, r Request) Admission
	timeout   time.Duration
	unclaimed bool
	calls     atomic.Int64
	// recheck decides a retry again; nil: it may run.
	recheck func() ([]Event, *envelope.CapabilityError)
	// recovery is the capability's; reconcile answers for its reconciler
	// (nil: it cannot tell).
	recovery  Recovery
	reconcile func(ctx context.Context) Reconciliation
}

func (c *testCap) Admit(ctx context.Context, r Request) Admission {
	if c.admit != nil {
		return c.admit(ctx, r)
	}
	return Admission{Unit: testUnit{c}}
}
func (c *testCap) Readmit(ctx context.Context, r Request) Admission {
	return Admission{Unit: testUnit{c}}
}
func (c *testCap) Timeout() time.Duration {
	if c.timeout == 0 {
		return time.Minute
	}
	return c.timeout
}
func (c *testCap) Retry(n int, err *envelope.CapabilityError) (time.Duration, bool) {
	if c.retry == nil {
		return 0, false
	}
	return c.retry(n, err)
}
func (c *testCap) Recovery() Recovery { return c.recovery }
func (c *testCap) Unclaimed() bool    { return c.unclaimed }
func (c *testCap) Rerunnable() bool   { return true }

// testUnit runs its capability's handler.
type testUnit struct{ c *testCap }

func (u testUnit) Started(int) map[string]any { return map[string]any{} }
func (u testUnit) Work(ctx context.Context, a Attempt) (any, error) {
	u.c.calls.Add(1)
	if u.c.work == nil {
		return "done", nil
	}
	return u.c.work(ctx, a)
}
func (u testUnit) Output(out any) (envelope.Raw, *envelope.CapabilityError) {
	b, err := envelope.NewRaw(out)
	if err != nil {
		return nil, &envelope.CapabilityError{Code: envelope.CodeInternalError, Stage: envelope.StageOutput, Message: err.Error(), ExposeToModel: true}
	}
	return b, nil
}
func (u testUnit) FromReceipt(_ context.Context, _ int, receipt envelope.Raw) (any, error) {
	return receipt, nil
}
func (u testUnit) Reconcile(ctx context.Context, _ int, _ string) Reconciliation {
	if u.c.reconcile != nil {
		return u.c.reconcile(ctx)
	}
	return Reconciliation{Verdict: Inconclusive}
}
func (u testUnit) Recheck() ([]Event, *envelope.CapabilityError) {
	if u.c.recheck == nil {
		return nil, nil
	}
	return u.c.recheck()
}

// rig is a runner serving c, with its pool's consumer.
type rig struct {
	t    *testing.T
	r    *Runner
	b    *broker.Broker
	cons jetstream.Consumer
	c    *testCap
}

// newRig starts a rig serving c; cfg, when given, changes the runner's
// configuration before it starts.
func newRig(t *testing.T, c *testCap, cfg func(*Config)) *rig {
	return newRigOn(t, broker.Config{}, c, cfg)
}

// newRigOn is newRig on resources provisioned as bcfg says.
func newRigOn(t *testing.T, bcfg broker.Config, c *testCap, cfg func(*Config)) *rig {
	t.Helper()
	env := testenv.Start(t)
	nc := env.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	bcfg.Logger = slog.New(slog.DiscardHandler)
	b, err := broker.Provision(ctx, nc, bcfg)
	if err != nil {
		t.Fatal(err)
	}
	conf := Config{ID: "w-test", Lease: 30 * time.Second, Capabilities: map[string]Definition{testOp: c},
		Listed: func(string) (bool, error) { return false, nil }, Observer: observe.NopWorker{}}
	if cfg != nil {
		cfg(&conf)
	}
	r := NewRunner(nc, slog.New(slog.DiscardHandler), conf)
	r.Provisioned(b, auditemit.New(b.NC, auditemit.Options{Prefix: b.Names.Prefix(), Audit: b.Audit, Index: b.Index, Logger: slog.New(slog.DiscardHandler)}))
	t.Cleanup(r.Stop)
	cons, err := b.EnsurePool(ctx, broker.PoolConfig{Pool: "test", Capabilities: []string{testOp}, AckWait: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	return &rig{t: t, r: r, b: b, cons: cons, c: c}
}

// request is a new request for the rig's capability.
func (g *rig) request() *envelope.Request {
	return &envelope.Request{V: envelope.Version, ExecutionID: envelope.NewExecutionID(), CapabilityID: testOp, Input: mustRaw(map[string]any{"n": 1}),
		SubmittedAt: time.Now().UTC(),
		Surface:     "direct", Actor: envelope.Actor{ID: "u1", Kind: "user"}}
}

// key is req's key in the buckets.
func (g *rig) key(req *envelope.Request) string { return broker.Key(broker.Anonymous, req.ExecutionID) }

// publish puts req in the rig's queue, as a producer does.
func (g *rig) publish(req *envelope.Request) {
	g.publishAs(req, g.r.w.ids.Request(broker.Anonymous, req.ExecutionID))
}

// publishAs puts req in the queue under message id msgID.
func (g *rig) publishAs(req *envelope.Request, msgID string) {
	g.t.Helper()
	data, err := envelope.Marshal(req)
	if err != nil {
		g.t.Fatal(err)
	}
	if _, err := g.b.JS.Publish(ctxT(g.t), g.b.Names.ExecSubject(broker.Anonymous, testOp), data,
		jetstream.WithMsgID(msgID)); err != nil {
		g.t.Fatal(err)
	}
}

// next is the queue's next delivery.
func (g *rig) next() jetstream.Msg {
	g.t.Helper()
	batch, err := g.cons.Fetch(1, jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		g.t.Fatal(err)
	}
	for msg := range batch.Messages() {
		return msg
	}
	g.t.Fatalf("no delivery: %v", batch.Error())
	return nil
}

// redelivered is the queue's next request delivered a second time: its
// first delivery is given back at once.
func (g *rig) redelivered() jetstream.Msg {
	g.t.Helper()
	if err := g.next().Nak(); err != nil {
		g.t.Fatal(err)
	}
	return g.next()
}

// handle carries msg through the runner's pass, as its intake does.
func (g *rig) handle(msg jetstream.Msg) { g.r.handle(msg, false) }

// record is req's execution record, nil when there is none.
func (g *rig) record(req *envelope.Request) *Record {
	g.t.Helper()
	rec, _, err := g.r.w.store.load(g.key(req))
	if errors.Is(err, broker.ErrNotFound) {
		return nil
	}
	if err != nil {
		g.t.Fatal(err)
	}
	return rec
}

// envelope is req's envelope, nil when there is none.
func (g *rig) envelope(req *envelope.Request) *envelope.Envelope {
	g.t.Helper()
	env, err := g.r.w.store.envelope(g.key(req))
	if err != nil {
		g.t.Fatal(err)
	}
	return env
}

// trail is the types of req's audit events, once the worker's emitter has
// sent what it has.
func (g *rig) trail(req *envelope.Request) []string { return trailTypes(g.t, g.r, req.ExecutionID) }

// pending is how many deliveries of the rig's queue are neither
// acknowledged nor terminated.
func (g *rig) pending() int {
	g.t.Helper()
	info, err := g.cons.Info(ctxT(g.t))
	if err != nil {
		g.t.Fatal(err)
	}
	return info.NumAckPending + int(info.NumPending)
}

// othersClaim writes a record of req claimed by another worker, in state
// st, its lease until leaseUntil; it returns that claim.
func (g *rig) othersClaim(req *envelope.Request, st State, leaseUntil time.Time) *claim {
	g.t.Helper()
	c := g.r.newClaim(g.key(req))
	rec := claimRecord(req.ExecutionID, "w-other", c.token, st, leaseUntil)
	rec.CapabilityID = testOp
	h, _ := envelope.InputHash(req.Input)
	claimedFor(rec, req, h)
	if _, _, ok := c.create(rec, noStage{}); !ok {
		g.t.Fatal("the other worker's record not created")
	}
	return c
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func count(types []string, typ string) int {
	n := 0
	for _, ty := range types {
		if ty == typ {
			n++
		}
	}
	return n
}

func mustRaw(v any) envelope.Raw {
	r, err := envelope.NewRaw(v)
	if err != nil {
		panic(err)
	}
	return r
}

// stageHook is an observer that calls on with the name of every stage an
// execution starts: a test's hook into the moment before a write.
type stageHook struct {
	observe.NopWorker
	on func(name string)
}

func (h stageHook) Begin(ctx context.Context, _ observe.Delivery) (context.Context, observe.Execution) {
	return ctx, stageHookExecution{on: h.on}
}

type stageHookExecution struct {
	observe.NopExecution
	on func(name string)
}

func (h stageHookExecution) Stage(ctx context.Context, name string) (context.Context, func(error)) {
	h.on(name)
	return ctx, func(error) {}
}

// takeOverAs has another worker, named worker, take req's record over by
// compare-and-swap, its lease a minute long; it returns its claim token.
func (g *rig) takeOverAs(req *envelope.Request, worker string) string {
	g.t.Helper()
	c := g.r.newClaim(g.key(req))
	cur, rev, err := g.r.w.store.load(g.key(req))
	if err != nil {
		g.t.Fatal(err)
	}
	c.hold(cur, rev)
	if err := c.update(func(r *Record) {
		r.Worker, r.Claim, r.LeaseUntil = worker, c.token, time.Now().UTC().Add(time.Minute)
	}); err != nil {
		g.t.Fatal(err)
	}
	return c.token
}

// otherWorkersEnvelope writes the envelope of a completed execution id that
// another worker finalized.
func otherWorkersEnvelope(t *testing.T, w *worker, id string) {
	t.Helper()
	env := &envelope.Envelope{V: envelope.Version, ExecutionID: id, CapabilityID: testOp, Status: envelope.StatusCompleted,
		Attempts: 1, FinalizedBy: "w-other", FinalizedAt: time.Now().UTC()}
	if err := w.store.createEnvelope(broker.Key(broker.Anonymous, id), env, sealed{}); err != nil {
		t.Fatal(err)
	}
}

// trailTypes is the types of an execution's audit events, once r's emitter
// has sent what it has.
func trailTypes(t *testing.T, r *Runner, executionID string) []string {
	t.Helper()
	if err := r.w.audit.Flush(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	evs, err := audit.Read(ctxT(t), r.w.b.NC, r.w.b.Names.Prefix(), broker.Anonymous, executionID)
	if err != nil && !errors.Is(err, broker.ErrNotFound) {
		t.Fatal(err)
	}
	types := make([]string, len(evs))
	for i, ev := range evs {
		types[i] = ev.Type
	}
	return types
}
