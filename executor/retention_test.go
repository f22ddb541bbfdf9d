package executor_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/execution"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/execrpc"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// uuidV7At is a UUIDv7 whose time is at.
func uuidV7At(at time.Time) string {
	u := uuid.Must(uuid.NewV7())
	ms := at.UnixMilli()
	for i := 0; i < 6; i++ {
		u[i] = byte(ms >> (40 - 8*i))
	}
	return u.String()
}

// waitEnvelopeGone waits until the bucket no longer holds id's envelope.
func (s *store) waitEnvelopeGone(id string) {
	s.t.Helper()
	waitUntil(s.t, "the envelope of "+id+" expires", func() bool {
		_, err := s.b.Envelopes.Get(ctxT(s.t), broker.Key(broker.Anonymous, id))
		return errors.Is(err, jetstream.ErrKeyNotFound)
	})
}

// An execution whose envelope expired (a real bucket TTL of a few seconds) is
// answered EXPIRED at once by Await and Status, never waited for: with the
// outcome its record still holds, and as an unknown execution once the record
// is gone too.
func TestEnvelopeRetention_AwaitOfAnExpiredExecution_AnswersExpired(t *testing.T) {
	t.Parallel()
	const retention = 3 * time.Second
	cfg := broker.Config{EnvelopeRetention: retention}
	env := testenv.Start(t)
	s := newStoreWith(t, env, cfg, executor.ClientConfig{})
	// A short lease: the record, not rewritten after the envelope, stops
	// saying the execution may be in flight when it runs out.
	startWorker(t, env.Connect(t), executor.WorkerConfig{Pool: "p", Deployment: executor.Deployment(cfg), Lease: time.Second}, echoCap(nil))

	got, err := s.c.Call(ctxT(t), "demo.echo", map[string]any{"hello": "hi"})
	if err != nil || got.Status != envelope.StatusCompleted {
		t.Fatalf("call: %v %+v", err, got)
	}
	id := got.ExecutionID
	s.waitEnvelopeGone(id)

	// Its record outlived the envelope: EXPIRED, with the state the record
	// last said (running: nothing writes it after the envelope).
	_, err = s.c.Await(ctxT(t), id)
	var xerr *executor.ExpiredError
	if !errors.As(err, &xerr) || !errors.Is(err, executor.ErrExpired) || errors.Is(err, executor.ErrNoSuchExecution) {
		t.Fatalf("await of an expired execution with its record: %v, want an ExpiredError that is not unknown", err)
	}
	made, _ := envelope.ExecutionIDTime(id)
	if xerr.ExecutionID != id || !xerr.MadeAt.Equal(made) || xerr.Retention != retention || xerr.State != execution.StateRunning {
		t.Fatalf("expired error %+v: want id %s made %v, retention %v, state running", xerr, id, made, retention)
	}
	if msg := err.Error(); !strings.Contains(msg, "expired") || !strings.Contains(msg, id) || !strings.Contains(msg, retention.String()) {
		t.Errorf("message %q does not say the id expired and the retention", msg)
	}

	// The record gone too: EXPIRED, and unknown.
	if err := s.b.Executions.Purge(ctxT(t), broker.Key(broker.Anonymous, id)); err != nil {
		t.Fatal(err)
	}
	_, err = s.c.Await(ctxT(t), id)
	if !errors.As(err, &xerr) || !errors.Is(err, executor.ErrExpired) || !errors.Is(err, executor.ErrNoSuchExecution) || xerr.State != "" {
		t.Fatalf("await of an expired execution without a record: %v, want ExpiredError and ErrNoSuchExecution", err)
	}
	if _, err := s.c.Status(ctxT(t), id); !errors.Is(err, executor.ErrExpired) || !errors.Is(err, executor.ErrNoSuchExecution) {
		t.Fatalf("status of an expired execution: %v, want ErrExpired and ErrNoSuchExecution", err)
	}
}

// EXPIRED is said only of a UUIDv7 id older than the bucket's retention with
// no envelope and no execution in flight: an id that is young, not a UUIDv7,
// or still running is waited for, and an old id's envelope, when there is
// one, is the answer.
func TestEnvelopeRetention_OnlyOldUUIDv7WithoutEnvelopeOrRunningRecordIsExpired(t *testing.T) {
	t.Parallel()
	const retention = time.Hour
	env := testenv.Start(t)
	s := newStoreWith(t, env, broker.Config{EnvelopeRetention: retention}, executor.ClientConfig{})
	old := time.Now().Add(-2 * retention)

	// Old, nothing stored: expired at once.
	gone := uuidV7At(old)
	if _, err := s.c.Await(ctxT(t), gone); !errors.Is(err, executor.ErrExpired) {
		t.Fatalf("await of an old id with nothing stored: %v, want ErrExpired", err)
	}

	// Old, with its envelope: the envelope.
	kept := uuidV7At(old)
	stored := &envelope.Envelope{V: envelope.Version, ExecutionID: kept, CapabilityID: "demo.echo",
		Status: envelope.StatusCompleted, FinalizedAt: time.Now().UTC()}
	if _, err := broker.Create(ctxT(t), s.b.Envelopes, broker.Key(broker.Anonymous, kept), stored); err != nil {
		t.Fatal(err)
	}
	if got, err := s.c.Await(ctxT(t), kept); err != nil || got.ExecutionID != kept || got.Status != envelope.StatusCompleted {
		t.Fatalf("await of an old id whose envelope is kept: %v %+v", err, got)
	}

	// Old, still running: waited for.
	running := uuidV7At(old)
	s.putRecord(&execution.Record{ExecutionID: running, CapabilityID: "demo.echo", State: execution.StateRunning,
		Attempt: 1, Worker: "w1", Claim: "c1", LeaseUntil: time.Now().Add(time.Hour).UTC()})
	for _, id := range []string{running, envelope.NewExecutionID()} {
		ctx, cancel := context.WithTimeout(ctxT(t), 300*time.Millisecond)
		_, err := s.c.Await(ctx, id)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("await of %s: %v, want it to wait until its context ends", id, err)
		}
	}
	// A custom id says nothing of its age: never expired, only unknown.
	if _, err := s.c.Await(ctxT(t), "custom-id-1"); !errors.Is(err, executor.ErrNoSuchExecution) || errors.Is(err, executor.ErrExpired) {
		t.Fatalf("await of custom-id-1: %v, want no such execution, not expired", err)
	}
	// Neither an unknown young id nor an unknown custom id is said to be expired.
	for _, id := range []string{envelope.NewExecutionID(), "custom-id-2"} {
		if _, err := s.c.Status(ctxT(t), id); !errors.Is(err, executor.ErrNoSuchExecution) || errors.Is(err, executor.ErrExpired) {
			t.Fatalf("status of %s: %v, want unknown, not expired", id, err)
		}
	}
}

// requestStartBy reads the start deadline of the last request the exec
// stream stored.
func (s *store) requestStartBy() (submitted, startBy time.Time) {
	s.t.Helper()
	info, err := s.b.Exec.Info(ctxT(s.t))
	if err != nil {
		s.t.Fatal(err)
	}
	m, err := s.b.Exec.GetMsg(ctxT(s.t), info.State.LastSeq)
	if err != nil {
		s.t.Fatal(err)
	}
	var r envelope.Request
	if err := envelope.Unmarshal(m.Data, &r); err != nil || r.StartBy == nil {
		s.t.Fatalf("request: %v, startBy %v", err, r.StartBy)
	}
	return r.SubmittedAt, *r.StartBy
}

// A client never gives a request a start window its envelope could not
// outlive: the client's StartWithin and a call's are cut to MaxStartWithin of
// the retention the bucket keeps; shorter ones are kept.
func TestEnvelopeRetention_StartWithinIsCutBelowIt(t *testing.T) {
	t.Parallel()
	if got := broker.MaxStartWithin(broker.DefaultEnvelopeRetention); got != 24*time.Hour {
		t.Fatalf("MaxStartWithin(default retention) = %v, want the default start window, 24h", got)
	}
	const retention = 2 * time.Hour
	env := testenv.Start(t)
	maxStart := broker.MaxStartWithin(retention)
	if maxStart != retention-12*time.Minute {
		t.Fatalf("MaxStartWithin(%v) = %v, want the retention less a tenth", retention, maxStart)
	}
	for _, tc := range []struct {
		name   string
		client time.Duration
		opts   []executor.CallOption
		want   time.Duration
	}{
		{"the default window", 0, nil, maxStart},
		{"a client's longer window", 48 * time.Hour, nil, maxStart},
		{"a call's longer window", 0, []executor.CallOption{executor.StartWithin(72 * time.Hour)}, maxStart},
		{"a call's shorter window", 0, []executor.CallOption{executor.StartWithin(10 * time.Minute)}, 10 * time.Minute},
		{"a client's shorter window", 30 * time.Minute, nil, 30 * time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStoreWith(t, env, broker.Config{EnvelopeRetention: retention}, executor.ClientConfig{StartWithin: tc.client})
			if _, err := s.c.Submit(ctxT(t), "test.unserved", nil, tc.opts...); err != nil {
				t.Fatal(err)
			}
			submitted, startBy := s.requestStartBy()
			if got := startBy.Sub(submitted); got != tc.want {
				t.Fatalf("start window %v, want %v", got, tc.want)
			}
		})
	}
}

// A call listed running that ended is not listed running once its envelope
// expired (the index keeps its entries longer than the envelopes): asked for
// running ones alone, through the workers and through an admin's own
// reading. A call still running past the retention stays listed.
func TestEnvelopeRetention_AnEndedCallIsNotListedRunningOnceItsEnvelopeExpired(t *testing.T) {
	t.Parallel()
	const retention = 6 * time.Second
	cfg := broker.Config{EnvelopeRetention: retention}
	env := testenv.Start(t)
	s := newStoreWith(t, env, cfg, executor.ClientConfig{})
	var sends, holds atomic.Int64
	done, hold := make(chan struct{}), make(chan struct{})
	// A lease shorter than the retention: the ended call's record, not
	// rewritten after its envelope, stops saying a worker holds it (the
	// record outlives the envelope here, as it never does at the
	// defaults), while the running call's is renewed.
	startWorker(t, env.Connect(t), executor.WorkerConfig{Pool: "p", Deployment: executor.Deployment(cfg), Lease: retention / 2},
		countedCap("t.send", &sends, done), countedCap("t.hold", &holds, hold))
	t.Cleanup(func() { close(hold) }) // before the worker stops
	ended, err := s.c.Submit(ctxT(t), "t.send", map[string]int{"n": 1})
	if err != nil {
		t.Fatal(err)
	}
	running, err := s.c.Submit(ctxT(t), "t.hold", map[string]int{"n": 2})
	if err != nil {
		t.Fatal(err)
	}
	admin, err := broker.OpenAll(ctxT(t), env.Connect(t), broker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	q := audit.Query{Status: audit.EntryRunning, Limit: 10}
	listed := func() (byWorkers, own map[string]bool) {
		page, err := s.c.Executions(ctxT(t), executor.ExecutionsRequest{Query: q})
		if err != nil {
			t.Fatal(err)
		}
		entries, _, _, err := execrpc.ListWithQueued(ctxT(t), admin, q, true)
		if err != nil {
			t.Fatal(err)
		}
		byWorkers, own = map[string]bool{}, map[string]bool{}
		for _, e := range page.Entries {
			byWorkers[e.ExecutionID] = true
		}
		for _, e := range entries {
			own[e.ExecutionID] = true
		}
		return byWorkers, own
	}
	waitUntil(t, "both calls listed running", func() bool {
		flushAudit(t)
		w, o := listed()
		return w[ended] && w[running] && o[ended] && o[running]
	})
	close(done)
	if got, err := s.c.Await(ctxT(t), ended); err != nil || got.Status != envelope.StatusCompleted {
		t.Fatalf("await: %v %+v", err, got)
	}
	s.waitEnvelopeGone(ended)
	w, o := listed()
	if w[ended] || o[ended] {
		t.Errorf("a call ended %v ago is listed running once its envelope expired: by the workers %v, in an admin's own listing %v",
			retention, w[ended], o[ended])
	}
	if !w[running] || !o[running] {
		t.Errorf("a call running longer than the envelopes' retention is not listed running: by the workers %v, in an admin's own listing %v",
			w[running], o[running])
	}
	if sends.Load() != 1 || holds.Load() != 1 {
		t.Errorf("handler calls: %d and %d, want one each", sends.Load(), holds.Load())
	}
}
