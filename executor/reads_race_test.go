package executor_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/capstan-dev/capstan/internal/testhooks"
)

// Two runs of one read at once: the first worker stalls past its ack timer
// (its renewals stopped), JetStream redelivers the request to a second
// worker while the first still runs, and both runs finish. One envelope
// stands, the first written; the trail shows both starts (the re-run naming
// its delivery), the losing run's envelope conflict, and its proof verifies
// the envelope that stands.
func TestReads_TwoRunsAtOnce_OneEnvelopeAndAnHonestTrail(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	nc := env.Connect(t)
	pub := runLog(t, nc)
	var slowCalls, calls atomic.Int64
	slowStarted, slowRelease := make(chan struct{}, 1), make(chan struct{})
	lease := time.Second
	slow := startWorker(t, env.Connect(t), testhooks.Worker(executor.WorkerConfig{ID: "stalled", Lease: lease}, noRenewal),
		gatedRead("t.read", &slowCalls, slowStarted, slowRelease))
	c := newClient(t, nc)
	id, err := c.Submit(ctxT(t), "t.read", echoIn{Hello: "twice"}, executor.As(alice))
	if err != nil {
		t.Fatal(err)
	}
	<-slowStarted
	released := make(chan struct{})
	close(released)
	startWorker(t, env.Connect(t), executor.WorkerConfig{ID: "second", Lease: lease},
		gatedRead("t.read", &calls, make(chan struct{}, 1), released))
	got, err := c.Await(ctxT(t), id)
	if err != nil || got.Status != envelope.StatusCompleted || got.FinalizedBy != "second" {
		t.Fatalf("envelope %+v %v, want completed by the second worker", got, err)
	}
	close(slowRelease)
	waitUntil(t, "the stalled run's end is on the trail", func() bool {
		evs, err := c.Trail(ctxT(t), id)
		return err == nil && len(ofType(evs, audit.EventEnvelopeConflict)) == 1
	})
	if err := slow.FlushAudit(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if slowCalls.Load() != 1 || calls.Load() != 1 {
		t.Fatalf("handler calls: stalled worker %d, second %d", slowCalls.Load(), calls.Load())
	}
	s, err := c.Status(ctxT(t), id)
	if err != nil || s.Envelope == nil || s.Envelope.FinalizedBy != "second" || !s.Envelope.FinalizedAt.Equal(got.FinalizedAt) {
		t.Fatalf("the envelope after both runs: %+v %v", s, err)
	}

	evs, err := c.Trail(ctxT(t), id)
	if err != nil {
		t.Fatal(err)
	}
	st := ofType(evs, audit.EventStarted)
	if len(st) != 2 || st[0].Data["delivery"] != nil || intValue(st[1].Data["delivery"]) < 2 {
		t.Errorf("starts %v: want the first run's, then the re-run's naming its delivery", st)
	}
	conflict := ofType(evs, audit.EventEnvelopeConflict)[0]
	if conflict.Data["finalizedBy"] != "second" || conflict.Data["reason"] != "envelope-exists" {
		t.Errorf("the losing run's conflict: %v", conflict.Data)
	}

	p, err := c.ProveTrail(ctxT(t), id)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Verify(pub); err != nil {
		t.Errorf("the proof of a read run twice: %v; trail %v", err, typesOf(evs))
	}
}

// Two versions of a registry disagree during a rollout: one declares t.op a
// read without claims, the other a write (no retry). Each worker runs it by
// its own declaration, and the write never runs twice: a read stalled past
// its ack timer leaves the request to a write worker, which claims it and
// writes once; a write worker lost mid-call leaves its record, which the
// read worker's delivery finds and takes over by its own retry rule (none:
// OUTCOME_UNKNOWN), never running the call again.
func TestReads_RegistriesDisagree_AWriteNeverRunsTwice(t *testing.T) {
	t.Parallel()
	op := func(side executor.SideEffect, calls *atomic.Int64, started chan<- struct{}, release <-chan struct{}) executor.Capability {
		return executor.Define("t.op", executor.Meta{Description: "Reads or writes.", Expose: executor.On(executor.SurfaceDirect),
			SideEffect: side, Idempotent: side == executor.SideEffectRead, Timeout: 10 * time.Minute},
			func(ctx context.Context, c executor.Call[echoIn]) (echoIn, error) {
				calls.Add(1)
				started <- struct{}{}
				select {
				case <-release:
					return c.Input, nil
				case <-ctx.Done():
					return echoIn{}, ctx.Err()
				}
			})
	}
	lease := time.Second
	open := make(chan struct{})
	close(open)

	t.Run("a stalled read, then a write worker", func(t *testing.T) {
		t.Parallel()
		env := testenv.Start(t)
		var reads, writes atomic.Int64
		readStarted, readRelease := make(chan struct{}, 1), make(chan struct{})
		startWorker(t, env.Connect(t), testhooks.Worker(executor.WorkerConfig{Lease: lease}, noRenewal),
			op(executor.SideEffectRead, &reads, readStarted, readRelease))
		c := newClient(t, env.Connect(t))
		id, err := c.Submit(ctxT(t), "t.op", echoIn{Hello: "x"}, executor.As(alice))
		if err != nil {
			t.Fatal(err)
		}
		<-readStarted
		writer := startWorker(t, env.Connect(t), executor.WorkerConfig{Lease: lease},
			op(executor.SideEffectWrite, &writes, make(chan struct{}, 4), open))
		got, err := c.Await(ctxT(t), id)
		if err != nil || got.Status != envelope.StatusCompleted {
			t.Fatalf("envelope %+v %v", got, err)
		}
		close(readRelease)
		waitUntil(t, "the stalled read's end is on the trail", func() bool {
			evs, err := c.Trail(ctxT(t), id)
			return err == nil && len(ofType(evs, audit.EventEnvelopeConflict)) == 1
		})
		if writes.Load() != 1 || writer.Stats().HandlerCalls != 1 {
			t.Errorf("the write ran %d times", writes.Load())
		}
	})

	t.Run("a lost write, then a read worker", func(t *testing.T) {
		t.Parallel()
		env := testenv.Start(t)
		var reads, writes atomic.Int64
		writeStarted, never := make(chan struct{}, 1), make(chan struct{})
		lostConn := env.Connect(t)
		lost := runWorkerOn(t, lostConn, executor.WorkerConfig{Lease: lease, Grace: time.Millisecond},
			op(executor.SideEffectWrite, &writes, writeStarted, never))
		c := newClient(t, env.Connect(t))
		id, err := c.Submit(ctxT(t), "t.op", echoIn{Hello: "x"}, executor.As(alice))
		if err != nil {
			t.Fatal(err)
		}
		<-writeStarted
		lostConn.Close()
		startWorker(t, env.Connect(t), executor.WorkerConfig{Lease: lease},
			op(executor.SideEffectRead, &reads, make(chan struct{}, 4), open))
		got, err := c.Await(ctxT(t), id)
		if err != nil {
			t.Fatal(err)
		}
		mustFailWith(t, got, envelope.CodeOutcomeUnknown)
		lost.Stop()
		if writes.Load() != 1 || reads.Load() != 0 {
			t.Errorf("calls: write %d, read %d; want the write's one", writes.Load(), reads.Load())
		}
	})
}
