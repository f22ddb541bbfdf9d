package executor_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/execution"
	"github.com/capstan-dev/capstan/internal/testhooks"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/auth"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// The tests of this file prove DESIGN §13: every accepted request ends, once.

// publishCopy sends another message of the same request under its own
// message id: a duplicated delivery, as a redelivery racing a live attempt is.
func (s *store) publishCopy(capabilityID, id, msgID string) {
	s.t.Helper()
	req := &envelope.Request{V: envelope.Version, ExecutionID: id, CapabilityID: capabilityID,
		Input: envelope.MustRaw(map[string]any{"n": 1}), Actor: alice, Surface: string(executor.SurfaceDirect),
		SubmittedAt: time.Now().UTC()}
	data, err := envelope.Marshal(req)
	if err != nil {
		s.t.Fatal(err)
	}
	m := nats.NewMsg(s.b.Names.ExecSubject(broker.Anonymous, capabilityID))
	m.Data = data
	m.Header.Set(jetstream.MsgIDHeader, msgID)
	if _, err := s.b.JS.PublishMsg(ctxT(s.t), m); err != nil {
		s.t.Fatalf("publish: %v", err)
	}
}

// Two workers share one id (a copied unit file): ownership is the claim's
// random token, so a delivery of an execution the other one runs waits for
// its lease, and every non-idempotent execution runs one attempt.
func TestClaimToken_WorkersSharingAnID_OneAttemptEach(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	s := newStore(t, env)
	const n = 20
	var mu sync.Mutex
	perID := map[string]int{}
	var a, b *executor.Worker
	var p probe
	p.gate = func(ctx context.Context, _ int) {
		// Hold every attempt until each request's two messages have been
		// delivered: the copy meets a live lease under the same worker id.
		for a == nil || b == nil || a.Stats().Handled+b.Stats().Handled < 2*n {
			select {
			case <-ctx.Done():
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	countCap := executor.Define("test.send", executor.Meta{
		Description: "Sends something; never retried.",
		Expose:      executor.On(executor.SurfaceDirect),
		SideEffect:  executor.SideEffectExternal,
	}, func(ctx context.Context, c executor.Call[map[string]any]) (probeOut, error) {
		mu.Lock()
		perID[c.ExecutionID]++
		mu.Unlock()
		p.called(ctx, c.Attempt)
		return probeOut{Attempt: c.Attempt}, ctx.Err()
	})
	cfg := executor.WorkerConfig{ID: "dup", Lease: 2 * time.Second, Concurrency: 2 * n}
	a = startWorker(t, env.Connect(t), cfg, countCap)
	b = startWorker(t, env.Connect(t), cfg, countCap)
	ids := make([]string, n)
	for i := range ids {
		ids[i] = envelope.NewExecutionID()
		s.publish("test.send", ids[i])
		s.publishCopy("test.send", ids[i], broker.Key(broker.Anonymous, ids[i])+".copy")
	}
	for _, id := range ids {
		got := s.await(id)
		if got.Status != envelope.StatusCompleted || got.Attempts != 1 {
			t.Errorf("%s: envelope %s after %d attempts, error %+v", id, got.Status, got.Attempts, got.Error)
		}
	}
	s.settled(ids[n-1])
	mu.Lock()
	defer mu.Unlock()
	for _, id := range ids {
		if perID[id] != 1 {
			t.Errorf("%s: handler called %d times", id, perID[id])
		}
	}
	if got := s.envelopeWrites(); got != n {
		t.Errorf("%d envelope writes for %d executions", got, n)
	}
}

// A worker that loses its lease ends its handler's context: the handler sees
// ctx.Done() whether another claim took the record over or the worker was cut
// off from the store until its lease ran out. It then leaves the execution to
// whoever owns it.
func TestLeaseLost_HandlerContextEnds(t *testing.T) {
	t.Parallel()
	t.Run("TakenOverByAnotherClaim", func(t *testing.T) {
		t.Parallel()
		env := testenv.Start(t)
		s := newStore(t, env)
		var p probe
		started, sawDone := holdUntilDone(&p)
		// Its own timeout is far beyond the test's waits: only the lost
		// claim can end the handler's context.
		w := startWorker(t, env.Connect(t), executor.WorkerConfig{ID: "w", Lease: time.Second}, longSendCap(&p))
		id := envelope.NewExecutionID()
		s.publish("test.send", id)
		waitClosed(t, started, "the handler never started")
		rec, rev := s.record(id)
		rec.Worker, rec.Claim = "other-worker", "other-claim"
		rec.LeaseUntil = time.Now().UTC().Add(time.Hour)
		rev, err := broker.Update(ctxT(t), s.b.Executions, broker.Key(broker.Anonymous, id), rec, rev)
		if err != nil {
			t.Fatal(err)
		}
		waitClosed(t, sawDone, "the handler's context did not end after the claim was taken over")
		// The worker that lost the claim never writes the record again: it
		// is the new owner's.
		if now, nowRev := s.record(id); nowRev != rev || now.Claim != "other-claim" {
			t.Fatalf("record rewritten by the worker that lost its claim: claim %s, revision %d, want %d", now.Claim, nowRev, rev)
		}
		if _, err := s.b.Envelopes.Get(ctxT(t), broker.Key(broker.Anonymous, id)); err == nil {
			t.Fatal("the worker that lost its claim finalized the execution")
		}
		if n := w.Stats().Finalized; n != 0 {
			t.Fatalf("%d envelopes finalized", n)
		}
	})
	t.Run("CutOffFromTheStore", func(t *testing.T) {
		t.Parallel()
		env := testenv.Start(t)
		s := newStore(t, env)
		var p probe
		started, sawDone := holdUntilDone(&p)
		// Its own timeout is far beyond the test's waits.
		startWorker(t, env.Connect(t), executor.WorkerConfig{ID: "w", Lease: time.Second}, longSendCap(&p))
		id := envelope.NewExecutionID()
		s.publish("test.send", id)
		waitClosed(t, started, "the handler never started")
		// The server stays down until the handler has seen its context end:
		// only the worker's own clock can end it.
		env.Stop()
		waitClosed(t, sawDone, "the handler's context did not end while the lease ran out")
		env.Restart(t)
		// The redelivery finds attempt 1 started and its lease gone: the
		// non-idempotent attempt is never repeated.
		got := s.await(id)
		if got.Status != envelope.StatusFailed || got.Error == nil || got.Error.Code != envelope.CodeOutcomeUnknown {
			t.Fatalf("envelope %s %+v, want OUTCOME_UNKNOWN", got.Status, got.Error)
		}
		if n := p.calls.Load(); n != 1 {
			t.Fatalf("handler called %d times", n)
		}
	})
}

// holdUntilDone makes p's handler hold until its context ends; started closes
// when it is called, sawDone when it saw ctx.Done().
// longSendCap is sendCap with a timeout far beyond any test's waits.
func longSendCap(p *probe) executor.Capability {
	return executor.Define("test.send", executor.Meta{
		Description: "Sends something; never retried.",
		Expose:      executor.On(executor.SurfaceDirect),
		SideEffect:  executor.SideEffectExternal,
		Timeout:     time.Hour,
	}, func(ctx context.Context, c executor.Call[map[string]any]) (probeOut, error) {
		p.called(ctx, c.Attempt)
		return probeOut{}, ctx.Err()
	})
}

func holdUntilDone(p *probe) (started, sawDone chan struct{}) {
	started, sawDone = make(chan struct{}), make(chan struct{})
	var once sync.Once
	p.gate = func(ctx context.Context, _ int) {
		once.Do(func() {
			close(started)
			<-ctx.Done() // bounded: the worker's shutdown ends it too
			close(sawDone)
		})
	}
	return started, sawDone
}

func waitClosed(t *testing.T, ch chan struct{}, msg string) {
	t.Helper()
	select {
	case <-ch:
	case <-ctxT(t).Done():
		t.Fatal(msg)
	}
}

// newStoreWith provisions the resources with cfg, as a server would, and
// opens a client and direct access to them.
func newStoreWith(t *testing.T, env *testenv.Env, cfg broker.Config, cc executor.ClientConfig) *store {
	t.Helper()
	nc := env.Connect(t)
	if _, err := broker.Provision(ctxT(t), nc, cfg); err != nil {
		t.Fatal(err)
	}
	cc.Deployment, cc.Actor = executor.Deployment(cfg), alice
	c, err := executor.NewClient(nc, cc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &store{t: t, nc: nc, b: testhooks.Broker(c), c: c}
}

// publishRequest sends a request as a producer does, on any subject.
func (s *store) publishRequest(subject string, req *envelope.Request) {
	s.t.Helper()
	req.V = envelope.Version
	if req.SubmittedAt.IsZero() {
		req.SubmittedAt = time.Now().UTC()
	}
	if req.Actor.ID == "" {
		req.Actor = alice
	}
	req.Surface = string(executor.SurfaceDirect)
	data, err := envelope.Marshal(req)
	if err != nil {
		s.t.Fatal(err)
	}
	m := nats.NewMsg(subject)
	m.Data = data
	m.Header.Set(jetstream.MsgIDHeader, req.ExecutionID)
	if _, err := s.b.JS.PublishMsg(ctxT(s.t), m); err != nil {
		s.t.Fatalf("publish: %v", err)
	}
}

// drained waits until the exec stream holds no message.
func (s *store) drained() {
	s.t.Helper()
	ctx := ctxT(s.t)
	for {
		info, err := s.b.Exec.Info(ctx)
		if err != nil {
			s.t.Fatal(err)
		}
		if info.State.Msgs == 0 {
			return
		}
		select {
		case <-ctx.Done():
			s.t.Fatalf("the exec stream still holds %d requests", info.State.Msgs)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func checkNotStarted(t *testing.T, got *envelope.Envelope) {
	t.Helper()
	if got.Status != envelope.StatusFailed || got.Error == nil || got.Error.Code != envelope.CodeNotStarted ||
		got.Attempts != 0 {
		t.Fatalf("envelope %s after %d attempts, error %+v; want failed NOT_STARTED", got.Status, got.Attempts, got.Error)
	}
	// The model is told it never ran, and not to expect it to by waiting.
	if m := got.ForModel(); m.Code != envelope.CodeNotStarted || m.Retryable {
		t.Fatalf("model sees %+v", m)
	}
}

// A request no worker takes ends without running, whatever the reason. One
// whose pool is down (its capability still listed) ends NOT_STARTED at its
// start deadline; one whose subject is routed to no consumer at all, of a
// capability nobody lists, ends CAPABILITY_NOT_FOUND at the first sweep,
// as a worker would end it (nothing parks, DESIGN §13). The sweeper, running
// in a worker of another pool, ends both; a worker of the pool that comes
// back later never runs them.
func TestStartDeadline_RequestsNobodyTakes_EndNotStarted(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	s := newStore(t, env)
	var p probe
	// Pool "down" served test.send once: its consumer and catalog entry are
	// still there, its workers are gone.
	downConn := env.Connect(t)
	stop := startWorkerUntil(t, downConn, executor.WorkerConfig{Pool: "down", SweepInterval: -1}, sendCap(&p))
	stop()
	downConn.Close()
	startWorker(t, env.Connect(t), executor.WorkerConfig{Pool: "other", SweepInterval: 50 * time.Millisecond}, echoCap(nil))

	downID, err := s.c.Submit(ctxT(t), "test.send", map[string]any{"n": 1}, executor.StartWithin(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	startBy := time.Now().UTC().Add(time.Hour)
	nowhere := &envelope.Request{ExecutionID: envelope.NewExecutionID(), CapabilityID: "test.nowhere", StartBy: &startBy}
	s.publishRequest(s.b.Names.ExecSubject(broker.Anonymous, "test.nowhere"), nowhere)

	for _, id := range []string{downID, nowhere.ExecutionID} {
		got := s.await(id)
		if id == downID {
			checkNotStarted(t, got)
		} else if got.Status != envelope.StatusFailed || got.Error == nil || got.Error.Code != envelope.CodeCapabilityNotFound || got.Attempts != 0 {
			t.Fatalf("a request routed nowhere, its deadline an hour away: %+v", got)
		}
		tr := s.settled(id)
		if n := count(tr, audit.EventFailed); n != 1 || count(tr, audit.EventStarted) != 0 {
			t.Errorf("%s: trail %v", id, typesOf(tr))
		}
		rec, _ := s.record(id)
		if rec.State != execution.StateFinalized || rec.Status != envelope.StatusFailed {
			t.Errorf("%s: record %s/%s", id, rec.State, rec.Status)
		}
	}
	// The pool comes back: nothing is left for it to run but a new request.
	startWorker(t, env.Connect(t), executor.WorkerConfig{Pool: "down", SweepInterval: -1}, sendCap(&p))
	if got, err := s.c.Call(ctxT(t), "test.send", map[string]any{"n": 2}); err != nil || got.Status != envelope.StatusCompleted {
		t.Fatalf("a new request: %v %+v", err, got)
	}
	s.drained()
	if n := p.calls.Load(); n != 1 {
		t.Fatalf("handler called %d times for one new request and two that ended NOT_STARTED", n)
	}
	if n := s.envelopeWrites(); n != 3 {
		t.Fatalf("%d envelope writes", n)
	}
}

// A request delivered to a worker after its start deadline ends NOT_STARTED
// on that delivery, without the sweeper: here a capability the catalog still
// lists but no running worker has, which is put back for a newer worker until
// its deadline passes.
func TestStartDeadline_DeliveredLate_EndsOnDelivery(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	s := newStore(t, env)
	var p probe
	startWorker(t, env.Connect(t), executor.WorkerConfig{ID: "old", RolloutDelay: 100 * time.Millisecond, SweepInterval: -1},
		echoCap(nil))
	// The catalog lists test.send in this pool (a newer worker is on its
	// way), and the pool's consumer covers it.
	d, err := envelope.Marshal(&executor.Descriptor{V: envelope.Version, ID: "test.send", Pool: "default",
		ExpiresAt: time.Now().UTC().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.b.Catalog.Put(ctxT(t), "test.send", d); err != nil {
		t.Fatal(err)
	}
	if _, err := s.b.EnsurePool(ctxT(t), broker.PoolConfig{Pool: "default", Capabilities: []string{"test.send"},
		MaxAckPending: 20000, AckWait: 30 * time.Second}); err != nil {
		t.Fatal(err)
	}
	startBy := time.Now().UTC().Add(500 * time.Millisecond)
	req := &envelope.Request{ExecutionID: envelope.NewExecutionID(), CapabilityID: "test.send", StartBy: &startBy}
	s.publishRequest(s.b.Names.ExecSubject(broker.Anonymous, "test.send"), req)
	got := s.await(req.ExecutionID)
	checkNotStarted(t, got)
	s.settled(req.ExecutionID)
	if got.FinalizedBy != "old" || p.calls.Load() != 0 {
		t.Fatalf("finalized by %s, %d calls", got.FinalizedBy, p.calls.Load())
	}
}

// Records outlive requests: the exec stream drops a request at the record
// TTL, and before that the request ends. Here a non-idempotent attempt starts,
// its worker is lost, and its pool stays down beyond the record TTL: the
// sweeper ends it OUTCOME_UNKNOWN before the TTL, JetStream keeps no copy to
// deliver, and when the pool comes back, after the record has expired, the
// attempt is never run again from scratch. The sweeper has the last tenth
// of the TTL (ttlMargin) to do it, from the deadline to the stream's drop:
// 1.2 s here, several passes even on a loaded machine (4 s left 400 ms).
func TestRecordTTL_RequestNeverOutlivesItsRecord(t *testing.T) {
	t.Parallel()
	const ttl = 12 * time.Second
	cfg := broker.Config{RecordTTL: ttl}
	env := testenv.Start(t)
	s := newStoreWith(t, env, cfg, executor.ClientConfig{})
	if info, err := s.b.Exec.Info(ctxT(t)); err != nil || info.Config.MaxAge != ttl {
		t.Fatalf("exec stream MaxAge: %v %v, want the record TTL %v", info.Config.MaxAge, err, ttl)
	}
	var p probe
	started, _ := holdUntilDone(&p)
	lostConn := env.Connect(t)
	s.runWorker(lostConn, executor.WorkerConfig{Pool: "p", Lease: time.Second, Deployment: executor.Deployment(cfg), SweepInterval: -1},
		sendCap(&p))
	s.runWorker(env.Connect(t), executor.WorkerConfig{Pool: "other", Deployment: executor.Deployment(cfg), SweepInterval: 50 * time.Millisecond},
		echoCap(nil))
	id, err := s.c.Submit(ctxT(t), "test.send", map[string]any{"n": 1})
	if err != nil {
		t.Fatal(err)
	}
	waitClosed(t, started, "the handler never started")
	lostConn.Close() // the worker is lost mid-attempt; its pool is down

	got := s.await(id)
	if got.Status != envelope.StatusFailed || got.Error == nil || got.Error.Code != envelope.CodeOutcomeUnknown || got.Attempts != 1 {
		t.Fatalf("envelope %s after %d attempts, error %+v; want OUTCOME_UNKNOWN", got.Status, got.Attempts, got.Error)
	}
	s.drained()
	// Wait until the record itself has expired.
	ctx := ctxT(t)
	for {
		_, err := s.b.Executions.Get(ctx, broker.Key(broker.Anonymous, id))
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the record never expired")
		case <-time.After(50 * time.Millisecond):
		}
	}
	// The pool comes back: nothing runs the request again.
	s.runWorker(env.Connect(t), executor.WorkerConfig{Pool: "p", Deployment: executor.Deployment(cfg), SweepInterval: -1}, sendCap(&p))
	if got, err := s.c.Call(ctxT(t), "test.send", map[string]any{"n": 2}); err != nil || got.Status != envelope.StatusCompleted {
		t.Fatalf("a new request: %v %+v", err, got)
	}
	s.drained()
	if n := p.calls.Load(); n != 2 {
		t.Fatalf("handler called %d times: want the lost attempt and the new request only", n)
	}
}

// runWorker runs a worker until the test ends (or stop is called) and waits
// until the catalog lists its capabilities.
func (s *store) runWorker(nc *nats.Conn, cfg executor.WorkerConfig, caps ...executor.Capability) (stop func()) {
	s.t.Helper()
	return runWorkerOn(s.t, nc, cfg, caps...).Stop
}

// A capability that no live worker serves any more lapses from the catalog:
// its pool lives on without it, so a request for it (here from a producer
// whose catalog still routes it to the pool) ends CAPABILITY_NOT_FOUND instead
// of being put back for ever. While the whole pool is down, its entries stay
// listed and requests wait for it, until their start deadline.
func TestCatalog_CapabilityNoLiveWorkerServes_Lapses(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	s := newStore(t, env)
	var p probe
	const ttl = 600 * time.Millisecond
	// The old release served test.send and demo.echo; the new one only demo.echo.
	oldConn := env.Connect(t)
	stop := startWorkerUntil(t, oldConn, executor.WorkerConfig{ID: "old", CatalogTTL: ttl}, sendCap(&p), echoCap(nil))
	stop()
	oldConn.Close()
	startWorker(t, env.Connect(t), executor.WorkerConfig{ID: "new", CatalogTTL: ttl, RolloutDelay: 100 * time.Millisecond},
		echoCap(nil))
	// Routed as a stale producer would: on the capability's own subject.
	id := envelope.NewExecutionID()
	s.publish("test.send", id)
	got := s.await(id)
	if got.Status != envelope.StatusFailed || got.Error == nil || got.Error.Code != envelope.CodeCapabilityNotFound {
		t.Fatalf("envelope %s %+v, want CAPABILITY_NOT_FOUND", got.Status, got.Error)
	}
	s.settled(id)
	if p.calls.Load() != 0 {
		t.Fatal("handler called")
	}
	// A client no longer routes it to the pool either.
	got, err := s.c.Call(ctxT(t), "test.send", map[string]any{"n": 1})
	if err != nil || got.Error == nil || got.Error.Code != envelope.CodeCapabilityNotFound {
		t.Fatalf("call: %v %+v", err, got)
	}
	// What the live worker serves stays listed across renewals, several TTLs on.
	ctx := ctxT(t)
	var rev uint64
	for renewals := 0; renewals < 4; {
		e, err := s.b.Catalog.Get(ctx, "demo.echo")
		if err != nil {
			t.Fatal(err)
		}
		if e.Revision() != rev {
			rev = e.Revision()
			renewals++
		}
		select {
		case <-ctx.Done():
			t.Fatal("the live worker's entries were not renewed")
		case <-time.After(50 * time.Millisecond):
		}
	}
	if got, err := s.c.Call(ctxT(t), "demo.echo", map[string]any{"hello": "still"}); err != nil || got.Status != envelope.StatusCompleted {
		t.Fatalf("demo.echo after renewals: %v %+v", err, got)
	}
}

// A worker's copy of the catalog follows the bucket a moment late: a newer
// worker has just listed a capability, and a producer that read the bucket
// routes a request for it to the pool (or, its own catalog stale, to
// _unrouted) before an older worker's copy has the entry. The older worker
// asks the bucket before it ends the request CAPABILITY_NOT_FOUND: it puts
// it back (forwards it), and the newer worker runs it. Here the older
// worker's copy is held back for the whole test.
func TestCatalog_WorkersCopyLagsTheBucket_RequestWaitsForTheNewerWorker(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		subject func(broker.Names) string
	}{
		{"RoutedToThePool", func(n broker.Names) string { return n.ExecSubject(broker.Anonymous, "test.send") }},
		{"Unrouted", func(n broker.Names) string { return n.UnroutedSubject(broker.Anonymous) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			env := testenv.Start(t)
			s := newStore(t, env)
			var p probe
			old := startWorker(t, env.Connect(t), testhooks.Worker(executor.WorkerConfig{ID: "old", RolloutDelay: 100 * time.Millisecond,
				SweepInterval: -1}, testhooks.WorkerKnobs{CatalogLag: time.Hour}), echoCap(nil))
			// The newer worker's start, up to its catalog entry: the pool's
			// consumer covers test.send, and the bucket lists it.
			if _, err := s.b.EnsurePool(ctxT(t), broker.PoolConfig{Pool: "default", Capabilities: []string{"test.send"},
				MaxAckPending: 20000, AckWait: 30 * time.Second}); err != nil {
				t.Fatal(err)
			}
			d, err := envelope.Marshal(&executor.Descriptor{V: envelope.Version, ID: "test.send", Pool: "default",
				ExpiresAt: time.Now().UTC().Add(time.Hour)})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.b.Catalog.Put(ctxT(t), "test.send", d); err != nil {
				t.Fatal(err)
			}
			req := &envelope.Request{ExecutionID: envelope.NewExecutionID(), CapabilityID: "test.send"}
			s.publishRequest(tc.subject(s.b.Names), req)
			// The older worker, alone in the pool, has put the request back
			// at least once (a third delivery), and not ended it.
			ctx := ctxT(t)
			for old.Stats().Handled < 3 {
				if st, err := s.c.Status(ctx, req.ExecutionID); err == nil && st.Envelope != nil {
					t.Fatalf("ended %s %+v by %s before a worker that serves it came", st.Envelope.Status, st.Envelope.Error,
						st.Envelope.FinalizedBy)
				}
				select {
				case <-ctx.Done():
					t.Fatalf("the older worker handled %d deliveries", old.Stats().Handled)
				case <-time.After(20 * time.Millisecond):
				}
			}
			startWorker(t, env.Connect(t), executor.WorkerConfig{ID: "new", SweepInterval: -1}, sendCap(&p))
			got := s.await(req.ExecutionID)
			if got.Status != envelope.StatusCompleted || got.FinalizedBy != "new" {
				t.Fatalf("envelope %s %+v by %s; want completed by the newer worker", got.Status, got.Error, got.FinalizedBy)
			}
			s.settled(req.ExecutionID)
			if n := p.calls.Load(); n != 1 {
				t.Fatalf("handler called %d times", n)
			}
		})
	}
}

// With authentication the same holds for a producer's client, which reads
// the catalog key by key, and for a sweeper whose worker credentials may not
// remove messages: a request whose pool is down ends NOT_STARTED, and when the
// pool comes back its worker finds the envelope and acknowledges the request
// without running it. A capability its live pool dropped ends
// CAPABILITY_NOT_FOUND.
func TestStartDeadline_WithAuthentication(t *testing.T) {
	t.Parallel()
	env, admin := secured(t, auth.Grant{Principal: "alice", Role: auth.RoleProducer, Actors: []string{"user:alice"},
		Capabilities: []string{"*"}})
	s := &store{t: t, nc: env.Connect(t), b: admin}
	var p probe
	const ttl = 600 * time.Millisecond
	downConn := env.ConnectAs(t, auth.WorkerPrincipal)
	stop := s.runWorker(downConn, executor.WorkerConfig{Pool: "down", SweepInterval: -1}, sendCap(&p))
	stop()
	downConn.Close()
	oldConn := env.ConnectAs(t, auth.WorkerPrincipal)
	stop = s.runWorker(oldConn, executor.WorkerConfig{ID: "old", CatalogTTL: ttl}, lookupCap(&p), echoCap(nil))
	stop()
	oldConn.Close()
	s.runWorker(env.ConnectAs(t, auth.WorkerPrincipal),
		executor.WorkerConfig{ID: "new", CatalogTTL: ttl, SweepInterval: 50 * time.Millisecond}, echoCap(nil))

	c, err := executor.NewClient(env.ConnectAs(t, "alice"), executor.ClientConfig{Actor: alice})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	got, err := c.Call(ctxT(t), "test.send", map[string]any{"n": 1}, executor.StartWithin(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	checkNotStarted(t, got)
	// The sweeper removes the request it ended: workers may delete messages
	// of the exec stream, and of no other stream.
	ctx := ctxT(t)
	for {
		info, err := admin.Exec.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Msgs == 0 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the exec stream still holds %d messages after the sweep", info.State.Msgs)
		case <-time.After(20 * time.Millisecond):
		}
	}
	// test.lookup lapses once no live worker of the default pool renews it:
	// routed to the pool while its entry lives, put back by the worker that
	// lacks it, then ended CAPABILITY_NOT_FOUND.
	got, err = c.Call(ctxT(t), "test.lookup", map[string]any{"n": 1})
	if err != nil || got.Error == nil || got.Error.Code != envelope.CodeCapabilityNotFound {
		t.Fatalf("test.lookup: %v %+v", err, got)
	}
	// The down pool comes back: its worker acknowledges the ended request.
	s.runWorker(env.ConnectAs(t, auth.WorkerPrincipal), executor.WorkerConfig{Pool: "down", SweepInterval: -1}, sendCap(&p))
	s.drained()
	if n := p.calls.Load(); n != 0 {
		t.Fatalf("handler called %d times", n)
	}
}

// sweepSentinel prepares a request only a sweeper ends, without writing a
// record: its record says it ended NOT_STARTED and its envelope is missing (its
// worker was lost between the two). It returns its id; sweepPassed sends it.
func (s *store) sweepSentinel() string {
	s.t.Helper()
	id := envelope.NewExecutionID()
	s.putRecord(&execution.Record{ExecutionID: id, CapabilityID: "test.send", State: execution.StateFinalized,
		Worker: deadWorker, Status: envelope.StatusFailed, LastError: envelope.CodeNotStarted})
	return id
}

// sweepPassed waits until a sweeper has finished a whole pass over every
// request stored before the call, with the two sentinels given: the first
// is ended by a pass that covers the earlier requests, the second, stored
// once the first is ended, only by a later pass, which starts when that one
// has finished.
func (s *store) sweepPassed(sentinels [2]string) {
	s.t.Helper()
	startBy := pastLease()
	for _, id := range sentinels {
		s.publishRequest(s.b.Names.ExecSubject(broker.Anonymous, "test.send"), &envelope.Request{ExecutionID: id,
			CapabilityID: "test.send", StartBy: &startBy})
		waitUntil(s.t, "the sweeper ended its sentinel", func() bool {
			_, _, err := broker.Load[envelope.Envelope](ctxT(s.t), s.b.Envelopes, broker.Key(broker.Anonymous, id))
			return err == nil
		})
	}
}

// noEnvelope fails the test if id has an envelope.
func (s *store) noEnvelope(id, why string) {
	s.t.Helper()
	if env, _, err := broker.Load[envelope.Envelope](ctxT(s.t), s.b.Envelopes, broker.Key(broker.Anonymous, id)); !errors.Is(err, broker.ErrNotFound) {
		s.t.Fatalf("%s: envelope %+v (%v)", why, env, err)
	}
}

// The sweeper ends only what no worker holds (DESIGN §13): a request past its
// start deadline whose record a live claim holds is its worker's, and one
// whose started attempt lost its worker before the request's TTL deadline is
// the pool's to take over (a read is retried). A whole pass leaves both
// untouched; then the pool's worker retries the read.
func TestSweeper_LiveClaimAndLostAttemptLeftToTheirPool(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	s := newStore(t, env)
	startBy := pastLease()
	live := envelope.NewExecutionID()
	liveRev := s.putRecord(&execution.Record{ExecutionID: live, CapabilityID: "test.send", State: execution.StateClaimed,
		Worker: "busy-worker", Claim: "busy-claim", LeaseUntil: time.Now().UTC().Add(time.Hour)})
	lost := envelope.NewExecutionID()
	lostRev := s.putRecord(&execution.Record{ExecutionID: lost, CapabilityID: "test.lookup", State: execution.StateRunning,
		Attempt: 1, Worker: deadWorker, Claim: "dead-claim", LeaseUntil: pastLease(), StartedAt: pastLease()})
	sentinels := [2]string{s.sweepSentinel(), s.sweepSentinel()}
	s.publishRequest(s.b.Names.ExecSubject(broker.Anonymous, "test.send"), &envelope.Request{ExecutionID: live,
		CapabilityID: "test.send", StartBy: &startBy})
	s.publishRequest(s.b.Names.ExecSubject(broker.Anonymous, "test.lookup"), &envelope.Request{ExecutionID: lost,
		CapabilityID: "test.lookup", StartBy: &startBy})
	// Only a sweeper sees them: no pool serves test.send or test.lookup yet.
	s.runWorker(env.Connect(t), executor.WorkerConfig{Pool: "other", SweepInterval: 50 * time.Millisecond}, echoCap(nil))
	s.sweepPassed(sentinels)
	s.noEnvelope(live, "the sweeper ended a request a live claim holds")
	s.noEnvelope(lost, "the sweeper ended a lost attempt before its TTL deadline")
	for id, rev := range map[string]uint64{live: liveRev, lost: lostRev} {
		if _, got := s.record(id); got != rev {
			t.Fatalf("the sweeper wrote the record of %s (revision %d, was %d)", id, got, rev)
		}
	}

	var p probe
	startWorker(t, env.Connect(t), executor.WorkerConfig{ID: "pool-worker", Lease: time.Second, SweepInterval: -1}, lookupCap(&p))
	got := s.await(lost)
	checkTakeover(t, takeover{status: envelope.StatusCompleted, attempts: 2, calls: []int{2}, takenFrom: execution.StateRunning,
		retried: 2}, got, s.settledTrail(lost), &p)
}

// settledTrail is the trail of id once its workers' events are stored.
func (s *store) settledTrail(id string) []audit.Event {
	s.t.Helper()
	flushAudit(s.t)
	return s.trail(id)
}

// setMaxMsgSize changes the largest message a stream accepts and returns the
// size it had: 1 refuses every write while reads go on.
func (s *store) setMaxMsgSize(stream string, size int32) int32 {
	s.t.Helper()
	st, err := s.b.JS.Stream(ctxT(s.t), stream)
	if err != nil {
		s.t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	was := cfg.MaxMsgSize
	cfg.MaxMsgSize = size
	if _, err := s.b.JS.UpdateStream(ctxT(s.t), cfg); err != nil {
		s.t.Fatalf("stream %s: set its largest message: %v", stream, err)
	}
	return was
}

// The sweeper claims a record by CAS before it writes an envelope, as a
// worker does: when its claim is not written (the store refuses it here;
// another worker moving first alike), it writes no envelope, which could
// otherwise say NOT_STARTED of a request another worker runs.
func TestSweeper_ClaimNotWritten_NoEnvelope(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	s := newStore(t, env)
	startBy := pastLease()
	id := envelope.NewExecutionID()
	rev := s.putRecord(&execution.Record{ExecutionID: id, CapabilityID: "test.send", State: execution.StateClaimed,
		Worker: deadWorker, Claim: "dead-claim", LeaseUntil: pastLease()})
	sentinels := [2]string{s.sweepSentinel(), s.sweepSentinel()}
	s.setMaxMsgSize("KV_"+s.b.Names.ExecutionsBucket(), 1)
	s.publishRequest(s.b.Names.ExecSubject(broker.Anonymous, "test.send"), &envelope.Request{ExecutionID: id,
		CapabilityID: "test.send", StartBy: &startBy})
	s.runWorker(env.Connect(t), executor.WorkerConfig{Pool: "other", SweepInterval: 50 * time.Millisecond}, echoCap(nil))
	s.sweepPassed(sentinels)
	s.noEnvelope(id, "the sweeper finalized a request it could not claim")
	if _, got := s.record(id); got != rev {
		t.Fatalf("record of %s at revision %d, was %d", id, got, rev)
	}
}

// Past a request's TTL deadline nothing starts another attempt of it (DESIGN
// §13), not even a retry-eligible read whose worker was lost: its record and
// its request would not outlive it. The takeover ends it OUTCOME_UNKNOWN.
// (The exec stream and the record are kept longer than their TTL here,
// behind the worker's back, so that a delivery is made past the deadline.)
func TestTTLDeadline_LostAttemptNotRetriedPastIt_OutcomeUnknown(t *testing.T) {
	t.Parallel()
	const ttl = 2 * time.Second
	cfg := broker.Config{RecordTTL: ttl}
	env := testenv.Start(t)
	s := newStoreWith(t, env, cfg, executor.ClientConfig{})
	var p probe
	s.runWorker(env.Connect(t), executor.WorkerConfig{Deployment: executor.Deployment(cfg), Lease: time.Second, SweepInterval: -1}, lookupCap(&p))
	for _, stream := range []string{s.b.Names.ExecStream(), "KV_" + s.b.Names.ExecutionsBucket()} {
		st, err := s.b.JS.Stream(ctxT(t), stream)
		if err != nil {
			t.Fatal(err)
		}
		c := st.CachedInfo().Config
		c.MaxAge = time.Hour
		if _, err := s.b.JS.UpdateStream(ctxT(t), c); err != nil {
			t.Fatalf("stream %s: %v", stream, err)
		}
	}
	// The lost worker's lease outlasts the TTL deadline (a tenth of the TTL
	// before it) by seconds: the takeover comes after it.
	id := envelope.NewExecutionID()
	leaseUntil := time.Now().UTC().Add(ttl + 3*time.Second)
	s.putRecord(&execution.Record{ExecutionID: id, CapabilityID: "test.lookup", State: execution.StateRunning, Attempt: 1,
		Worker: deadWorker, Claim: "dead-claim", LeaseUntil: leaseUntil, StartedAt: time.Now().UTC()})
	s.publish("test.lookup", id)
	m, err := s.b.Exec.GetLastMsgForSubject(ctxT(t), s.b.Names.ExecSubject(broker.Anonymous, "test.lookup"))
	if err != nil {
		t.Fatal(err)
	}
	if deadline := m.Time.Add(ttl - ttl/10); !leaseUntil.After(deadline) {
		t.Fatalf("the request was stored at %v, after its record's lease (%v) less the TTL's margin", m.Time, leaseUntil)
	}
	got := s.await(id)
	checkTakeover(t, takeover{status: envelope.StatusFailed, code: envelope.CodeOutcomeUnknown, attempts: 1,
		takenFrom: execution.StateRunning}, got, s.settled(id), &p)
}
