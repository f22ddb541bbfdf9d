package executor_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/broker"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/testenv"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
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
		SideEffect:  executor.External,
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
		s.publishCopy("test.send", ids[i], ids[i]+"-copy")
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
	t.Run("TakenOverByAnotherClaim", func(t *testing.T) {
		env := testenv.Start(t)
		s := newStore(t, env)
		var p probe
		started, sawDone := holdUntilDone(&p)
		w := startWorker(t, env.Connect(t), executor.WorkerConfig{ID: "w", Lease: time.Second}, sendCap(&p))
		id := envelope.NewExecutionID()
		s.publish("test.send", id)
		waitClosed(t, started, "the handler never started")
		rec, rev := s.record(id)
		rec.Worker, rec.Claim = "other-worker", "other-claim"
		rec.LeaseUntil = time.Now().UTC().Add(time.Hour)
		if _, err := broker.Update(ctxT(t), s.b.Executions, broker.Key(broker.Anonymous, id), rec, rev); err != nil {
			t.Fatal(err)
		}
		waitClosed(t, sawDone, "the handler's context did not end after the claim was taken over")
		if _, err := s.b.Envelopes.Get(ctxT(t), broker.Key(broker.Anonymous, id)); err == nil {
			t.Fatal("the worker that lost its claim finalized the execution")
		}
		if n := w.Stats().Finalized; n != 0 {
			t.Fatalf("%d envelopes finalized", n)
		}
	})
	t.Run("CutOffFromTheStore", func(t *testing.T) {
		env := testenv.Start(t)
		s := newStore(t, env)
		var p probe
		started, sawDone := holdUntilDone(&p)
		// Its own timeout is far beyond the test's waits.
		long := executor.Define("test.send", executor.Meta{
			Description: "Sends something; never retried.",
			Expose:      executor.On(executor.SurfaceDirect),
			SideEffect:  executor.External,
			Timeout:     time.Hour,
		}, func(ctx context.Context, c executor.Call[map[string]any]) (probeOut, error) {
			p.called(ctx, c.Attempt)
			return probeOut{}, ctx.Err()
		})
		startWorker(t, env.Connect(t), executor.WorkerConfig{ID: "w", Lease: time.Second}, long)
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
		if got.Status != envelope.StatusFailed || got.Error.Code != envelope.CodeOutcomeUnknown {
			t.Fatalf("envelope %s %+v, want OUTCOME_UNKNOWN", got.Status, got.Error)
		}
		if n := p.calls.Load(); n != 1 {
			t.Fatalf("handler called %d times", n)
		}
	})
}

// holdUntilDone makes p's handler hold until its context ends; started closes
// when it is called, sawDone when it saw ctx.Done().
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
