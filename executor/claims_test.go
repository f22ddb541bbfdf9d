package executor_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/execution"
	"github.com/capstan-dev/capstan/internal/testhooks"

	"github.com/nats-io/nats.go"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// The tests of this file prove DESIGN §5: the execution record, its lease, and
// what a worker does with each delivery, whatever it finds in the store.

const deadWorker = "dead-worker"

// probe counts the calls of a test capability and, when gate is set, holds
// each call until gate returns.
type probe struct {
	calls    atomic.Int64
	mu       sync.Mutex
	attempts []int
	gate     func(ctx context.Context, attempt int)
}

func (p *probe) called(ctx context.Context, attempt int) {
	p.calls.Add(1)
	p.mu.Lock()
	p.attempts = append(p.attempts, attempt)
	p.mu.Unlock()
	if p.gate != nil {
		p.gate(ctx, attempt)
	}
}

func (p *probe) seen() []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]int(nil), p.attempts...)
}

type probeOut struct {
	Attempt int `json:"attempt"`
}

// sendCap is a non-idempotent external effect: never retried.
func sendCap(p *probe) executor.Capability {
	return executor.Define("test.send", executor.Meta{
		Description: "Sends something; never retried.",
		Expose:      executor.On(executor.SurfaceDirect),
		SideEffect:  executor.SideEffectExternal,
	}, func(ctx context.Context, c executor.Call[map[string]any]) (probeOut, error) {
		p.called(ctx, c.Attempt)
		if err := ctx.Err(); err != nil {
			return probeOut{}, err
		}
		return probeOut{Attempt: c.Attempt}, nil
	})
}

// lookupCap is a read with one retry.
func lookupCap(p *probe) executor.Capability {
	return executor.Define("test.lookup", executor.Meta{
		Description: "Reads something; retried once.",
		Expose:      executor.On(executor.SurfaceDirect),
		SideEffect:  executor.SideEffectRead,
		Retry:       &executor.Retry{MaxAttempts: 1, Backoff: 10 * time.Millisecond},
	}, func(ctx context.Context, c executor.Call[map[string]any]) (probeOut, error) {
		p.called(ctx, c.Attempt)
		if err := ctx.Err(); err != nil {
			return probeOut{}, err
		}
		return probeOut{Attempt: c.Attempt}, nil
	})
}

// store gives a test direct access to the buckets and streams.
type store struct {
	t  *testing.T
	nc *nats.Conn
	b  *broker.Broker
	c  *executor.Client
}

func newStore(t *testing.T, env *testenv.Env) *store {
	t.Helper()
	nc := env.Connect(t)
	c := newClient(t, nc)
	return &store{t: t, nc: nc, b: testhooks.Broker(c), c: c}
}

// putRecord writes an execution record as a worker of this version would
// have left it.
func (s *store) putRecord(rec *execution.Record) uint64 {
	s.t.Helper()
	if rec.KeyVersion == 0 {
		rec.KeyVersion = envelope.IdempotencyKeyVersion
	}
	return s.putRecordAsIs(rec)
}

// putRecordAsIs writes an execution record with the key version it names (0:
// as a worker of a version before key versions left it).
func (s *store) putRecordAsIs(rec *execution.Record) uint64 {
	s.t.Helper()
	rec.V = envelope.Version
	if rec.CreatedAt.IsZero() {
		rec.CreatedAt = time.Now().UTC().Add(-time.Minute)
	}
	rec.UpdatedAt = rec.CreatedAt
	rev, err := broker.Create(ctxT(s.t), s.b.Executions, broker.Key(broker.Anonymous, rec.ExecutionID), rec)
	if err != nil {
		s.t.Fatalf("create record: %v", err)
	}
	return rev
}

func (s *store) record(id string) (*execution.Record, uint64) {
	s.t.Helper()
	rec, rev, err := broker.Load[execution.Record](ctxT(s.t), s.b.Executions, broker.Key(broker.Anonymous, id))
	if err != nil {
		s.t.Fatalf("load record %s: %v", id, err)
	}
	return rec, rev
}

// status is what the client's Status reads of an execution.
func (s *store) status(id string) *executor.ExecutionStatus {
	s.t.Helper()
	st, err := s.c.Status(ctxT(s.t), id)
	if err != nil || st.Record == nil {
		s.t.Fatalf("status of %s: %+v, %v", id, st, err)
	}
	return st
}

// publish sends the request message of an execution, as a producer does.
func (s *store) publish(capabilityID, id string) {
	s.t.Helper()
	s.publishCopy(capabilityID, id, id)
}

func (s *store) await(id string) *envelope.Envelope {
	s.t.Helper()
	env, err := s.c.Await(ctxT(s.t), id)
	if err != nil {
		s.t.Fatalf("await %s: %v", id, err)
	}
	return env
}

// envelopeWrites counts the envelopes the bucket ever stored: a second write
// for a key would show as a further sequence.
func (s *store) envelopeWrites() uint64 {
	s.t.Helper()
	st, err := s.b.JS.Stream(ctxT(s.t), "KV_"+s.b.Names.EnvelopesBucket())
	if err != nil {
		s.t.Fatal(err)
	}
	return st.CachedInfo().State.LastSeq
}

// storedEnvelope reads the envelope the bucket holds now.
func (s *store) storedEnvelope(id string) *envelope.Envelope {
	s.t.Helper()
	env, _, err := broker.Load[envelope.Envelope](ctxT(s.t), s.b.Envelopes, broker.Key(broker.Anonymous, id))
	if err != nil {
		s.t.Fatalf("envelope of %s: %v", id, err)
	}
	return env
}

// trail reads the audit events of one execution stored so far.
func (s *store) trail(id string) []audit.Event {
	s.t.Helper()
	// Message gets by subject: no consumer per read, however often a test
	// polls.
	tr, err := audit.Read(ctxT(s.t), s.b.NC, s.b.Names.Prefix(), broker.Anonymous, id)
	if err != nil && !errors.Is(err, broker.ErrNotFound) {
		s.t.Fatal(err)
	}
	return tr
}

// waitEvent waits until the trail holds an event of type typ (events are
// published asynchronously) and returns it.
func (s *store) waitEvent(id, typ string) audit.Event {
	s.t.Helper()
	ctx := ctxT(s.t)
	for {
		for _, ev := range s.trail(id) {
			if ev.Type == typ {
				return ev
			}
		}
		select {
		case <-ctx.Done():
			s.t.Fatalf("no %s event for %s; trail: %v", typ, id, typesOf(s.trail(id)))
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// settled waits until the execution's request is acknowledged (the work-queue
// stream holds no message) and every audit event the test's workers emitted
// is stored, so that counts read after it are final: a worker emits a
// delivery's events before it acknowledges it.
func (s *store) settled(id string) []audit.Event {
	s.t.Helper()
	ctx := ctxT(s.t)
	for {
		info, err := s.b.Exec.Info(ctx)
		if err != nil {
			s.t.Fatal(err)
		}
		if info.State.Msgs == 0 {
			break
		}
		select {
		case <-ctx.Done():
			s.t.Fatalf("request of %s never acknowledged", id)
		case <-time.After(20 * time.Millisecond):
		}
	}
	flushAudit(s.t)
	return s.trail(id)
}

func count(tr []audit.Event, typ string) int {
	n := 0
	for _, ev := range tr {
		if ev.Type == typ {
			n++
		}
	}
	return n
}

func find(tr []audit.Event, typ string) (audit.Event, bool) {
	for _, ev := range tr {
		if ev.Type == typ {
			return ev, true
		}
	}
	return audit.Event{}, false
}

// field renders one data field of an event (msgpack numbers come back in
// whichever width fits).
func field(ev audit.Event, key string) string { return fmt.Sprint(ev.Data[key]) }

func pastLease() time.Time { return time.Now().UTC().Add(-time.Second) }

// takeover is what a row of the table expects of the envelope and the trail.
type takeover struct {
	status   envelope.Status
	code     envelope.Code // of the envelope's error, if any
	attempts int
	// calls are the attempt numbers the handler saw.
	calls []int
	// takenFrom is the state an execution.taken_over event names, "" for none;
	// from the worker it names (default deadWorker).
	takenFrom execution.State
	from      string
	// retried is set when a capability.retried {attempt, WORKER_LOST} is due.
	retried int
}

func TestTakeoverTable(t *testing.T) {
	t.Parallel()
	const lease = 2 * time.Second
	cases := []struct {
		name string
		// read picks test.lookup (a read with one retry), else test.send.
		read bool
		// rec is the record found, nil for none.
		rec func(id string) *execution.Record
		// envelope is an envelope already finalized by another worker.
		envelope bool
		// late publishes the request with a start deadline already passed.
		late bool
		// noSweep runs the worker without its sweeper: the delivery decides.
		noSweep bool
		want    takeover
	}{
		{
			name: "NoRecord_ClaimAndRun",
			want: takeover{status: envelope.StatusCompleted, attempts: 1, calls: []int{1}},
		},
		{
			name: "ExpiredClaimed_TakeOverAndRun",
			rec: func(id string) *execution.Record {
				return &execution.Record{ExecutionID: id, CapabilityID: "test.send", State: execution.StateClaimed,
					Worker: deadWorker, LeaseUntil: pastLease()}
			},
			want: takeover{status: envelope.StatusCompleted, attempts: 1, calls: []int{1}, takenFrom: execution.StateClaimed},
		},
		{
			// A claim that never started its handler is run from the top only
			// before the request's start deadline; past it, NOT_STARTED.
			name: "ExpiredClaimedPastStartDeadline_NotStarted",
			late: true,
			rec: func(id string) *execution.Record {
				return &execution.Record{ExecutionID: id, CapabilityID: "test.send", State: execution.StateClaimed,
					Worker: deadWorker, LeaseUntil: pastLease()}
			},
			want: takeover{status: envelope.StatusFailed, code: envelope.CodeNotStarted, takenFrom: execution.StateClaimed},
		},
		{
			// A claim made where no record proved that no attempt had run (its
			// record may have expired under one) is marked WORKER_LOST; lost
			// before it decided, its takeover never runs a write from the top.
			name: "ExpiredClaimedWorkerLostWrite_OutcomeUnknown",
			rec: func(id string) *execution.Record {
				return &execution.Record{ExecutionID: id, CapabilityID: "test.send", State: execution.StateClaimed,
					LastError: envelope.CodeWorkerLost, Worker: deadWorker, LeaseUntil: pastLease()}
			},
			want: takeover{status: envelope.StatusFailed, code: envelope.CodeOutcomeUnknown, takenFrom: execution.StateClaimed},
		},
		{
			// A read, eligible for a retry after a lost worker, runs again.
			name: "ExpiredClaimedWorkerLostRead_Runs",
			read: true,
			rec: func(id string) *execution.Record {
				return &execution.Record{ExecutionID: id, CapabilityID: "test.lookup", State: execution.StateClaimed,
					LastError: envelope.CodeWorkerLost, Worker: deadWorker, LeaseUntil: pastLease()}
			},
			want: takeover{status: envelope.StatusCompleted, attempts: 1, calls: []int{1}, takenFrom: execution.StateClaimed},
		},
		{
			// A worker ended the request NOT_STARTED and was lost between its
			// record and its envelope: the delivery writes the envelope.
			name:    "FinalizedNotStartedWithoutEnvelope_EnvelopeWritten",
			noSweep: true,
			rec: func(id string) *execution.Record {
				return &execution.Record{ExecutionID: id, CapabilityID: "test.send", State: execution.StateFinalized,
					Worker: "live-worker", Status: envelope.StatusFailed, LastError: envelope.CodeNotStarted}
			},
			want: takeover{status: envelope.StatusFailed, code: envelope.CodeNotStarted},
		},
		{
			name: "ExpiredRunningRead_RetriedAfterWorkerLost",
			read: true,
			rec: func(id string) *execution.Record {
				return &execution.Record{ExecutionID: id, CapabilityID: "test.lookup", State: execution.StateRunning, Attempt: 1,
					Worker: deadWorker, LeaseUntil: pastLease(), StartedAt: pastLease()}
			},
			want: takeover{status: envelope.StatusCompleted, attempts: 2, calls: []int{2}, takenFrom: execution.StateRunning, retried: 2},
		},
		{
			name: "ExpiredBackoffRead_RetriedAfterWorkerLost",
			read: true,
			rec: func(id string) *execution.Record {
				return &execution.Record{ExecutionID: id, CapabilityID: "test.lookup", State: execution.StateBackoff, Attempt: 1,
					LastError: envelope.CodeTimeout, Worker: deadWorker, LeaseUntil: pastLease(), StartedAt: pastLease()}
			},
			want: takeover{status: envelope.StatusCompleted, attempts: 2, calls: []int{2}, takenFrom: execution.StateBackoff, retried: 2},
		},
		{
			name: "ExpiredRunningWrite_OutcomeUnknown",
			rec: func(id string) *execution.Record {
				return &execution.Record{ExecutionID: id, CapabilityID: "test.send", State: execution.StateRunning, Attempt: 1,
					Worker: deadWorker, LeaseUntil: pastLease(), StartedAt: pastLease()}
			},
			want: takeover{status: envelope.StatusFailed, code: envelope.CodeOutcomeUnknown, attempts: 1, takenFrom: execution.StateRunning},
		},
		{
			name: "ExpiredRunningRead_NoAttemptsLeft_OutcomeUnknown",
			read: true,
			rec: func(id string) *execution.Record {
				return &execution.Record{ExecutionID: id, CapabilityID: "test.lookup", State: execution.StateRunning, Attempt: 2,
					Worker: deadWorker, LeaseUntil: pastLease(), StartedAt: pastLease()}
			},
			want: takeover{status: envelope.StatusFailed, code: envelope.CodeOutcomeUnknown, attempts: 2, takenFrom: execution.StateRunning},
		},
		{
			name: "CancelRequestedRunning_CancelledWithoutHandler",
			read: true,
			rec: func(id string) *execution.Record {
				return &execution.Record{ExecutionID: id, CapabilityID: "test.lookup", State: execution.StateRunning, Attempt: 1,
					Worker: deadWorker, LeaseUntil: pastLease(), CancelRequested: true, CancelRequestedAt: pastLease()}
			},
			want: takeover{status: envelope.StatusCancelled, code: envelope.CodeCancelled, attempts: 1, takenFrom: execution.StateRunning},
		},
		{
			name: "CancelRequestedBeforeClaim_CancelledWithoutHandler",
			rec: func(id string) *execution.Record {
				return &execution.Record{ExecutionID: id, State: execution.StatePending, CancelRequested: true,
					CancelRequestedAt: pastLease()}
			},
			want: takeover{status: envelope.StatusCancelled, code: envelope.CodeCancelled},
		},
		{
			name:     "EnvelopeExists_AckDuplicateNoAttempt",
			envelope: true,
			rec: func(id string) *execution.Record {
				return &execution.Record{ExecutionID: id, CapabilityID: "test.send", State: execution.StateFinalized, Attempt: 1,
					Worker: deadWorker, Status: envelope.StatusCompleted}
			},
			want: takeover{status: envelope.StatusCompleted, attempts: 1},
		},
		{
			// The worker stored the envelope and died before recording it.
			name:     "EnvelopeExistsRecordRunning_AckDuplicateNoAttempt",
			envelope: true,
			rec: func(id string) *execution.Record {
				return &execution.Record{ExecutionID: id, CapabilityID: "test.send", State: execution.StateRunning, Attempt: 1,
					Worker: deadWorker, LeaseUntil: time.Now().UTC().Add(time.Hour)}
			},
			want: takeover{status: envelope.StatusCompleted, attempts: 1},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			env := testenv.Start(t)
			s := newStore(t, env)
			id := envelope.NewExecutionID()
			capID := "test.send"
			if tc.read {
				capID = "test.lookup"
			}
			if tc.rec != nil {
				s.putRecord(tc.rec(id))
			}
			if tc.envelope {
				done := &envelope.Envelope{V: envelope.Version, ExecutionID: id, CapabilityID: capID,
					Status: envelope.StatusCompleted, Attempts: 1, FinalizedBy: deadWorker, FinalizedAt: pastLease()}
				if _, err := broker.Create(ctxT(t), s.b.Envelopes, broker.Key(broker.Anonymous, id), done); err != nil {
					t.Fatal(err)
				}
			}
			if tc.late {
				startBy := pastLease()
				s.publishRequest(s.b.Names.ExecSubject(broker.Anonymous, capID), &envelope.Request{ExecutionID: id,
					CapabilityID: capID, Input: envelope.MustRaw(map[string]any{"n": 1}), Actor: alice,
					Surface: string(executor.SurfaceDirect), StartBy: &startBy})
			} else {
				s.publish(capID, id)
			}
			var p probe
			cfg := executor.WorkerConfig{ID: "live-worker", Lease: lease}
			if tc.late || tc.noSweep {
				cfg.SweepInterval = -1 // the delivery decides, not the sweeper
			}
			w := startWorker(t, env.Connect(t), cfg, sendCap(&p), lookupCap(&p))

			got := s.await(id)
			tr := s.settled(id)
			checkTakeover(t, tc.want, got, tr, &p)
			if tc.envelope {
				if got.FinalizedBy != deadWorker {
					t.Errorf("envelope rewritten by %s", got.FinalizedBy)
				}
				if n := count(tr, audit.EventDuplicateDelivery); n != 1 {
					t.Errorf("%d duplicate_delivery events, want 1; trail %v", n, typesOf(tr))
				}
				if n := w.Stats().Duplicates; n != 1 {
					t.Errorf("worker counted %d duplicates", n)
				}
				// The envelope is the proof (DESIGN §14): the record its lost
				// worker left is not rewritten, and status reads it as the
				// envelope says.
				if rec, _ := s.record(id); rec.Worker != deadWorker {
					t.Errorf("record %+v rewritten after the envelope", rec)
				}
				if st := s.status(id); st.Record.State != execution.StateFinalized || st.Record.Status != got.Status {
					t.Errorf("status %s/%s, envelope %s", st.Record.State, st.Record.Status, got.Status)
				}
			} else {
				rec, _ := s.record(id)
				st := s.status(id)
				if rec.Worker != "live-worker" || st.Record.State != execution.StateFinalized || st.Record.Status != got.Status {
					t.Errorf("record %+v after the envelope %s", rec, got.Status)
				}
			}
			if n := s.envelopeWrites(); n != 1 {
				t.Errorf("the envelope bucket stored %d writes, want 1", n)
			}
		})
	}
}

func checkTakeover(t *testing.T, want takeover, got *envelope.Envelope, tr []audit.Event, p *probe) {
	t.Helper()
	if got.Status != want.status || got.Attempts != want.attempts {
		t.Errorf("envelope %s after %d attempts, want %s after %d; error %+v", got.Status, got.Attempts,
			want.status, want.attempts, got.Error)
	}
	if want.code != "" {
		if got.Error == nil || got.Error.Code != want.code {
			// What follows reads the error: stop here rather than panic on it.
			t.Fatalf("error %+v, want code %s", got.Error, want.code)
		}
	}
	if want.code == envelope.CodeOutcomeUnknown {
		// The effect may or may not have happened: the model is told so, and
		// told not to simply try again.
		m := got.ForModel()
		if m.Code != envelope.CodeOutcomeUnknown || m.Retryable {
			t.Errorf("model sees %+v, want OUTCOME_UNKNOWN, not retryable", m)
		}
	}
	if calls := p.seen(); fmt.Sprint(calls) != fmt.Sprint(want.calls) && !(len(calls) == 0 && len(want.calls) == 0) {
		t.Errorf("handler called with attempts %v, want %v", calls, want.calls)
	}
	if want.takenFrom == "" {
		if n := count(tr, audit.EventTakenOver); n != 0 {
			t.Errorf("%d taken_over events, want none; trail %v", n, typesOf(tr))
		}
	} else {
		from := want.from
		if from == "" {
			from = deadWorker
		}
		ev, ok := find(tr, audit.EventTakenOver)
		if !ok || field(ev, "fromWorker") != from || field(ev, "state") != string(want.takenFrom) {
			t.Errorf("taken_over %v, want from %s in %s; trail %v", ev.Data, from, want.takenFrom, typesOf(tr))
		}
	}
	retried := 0
	for _, ev := range tr {
		if ev.Type != audit.EventRetried {
			continue
		}
		retried++
		if want.retried == 0 || field(ev, "attempt") != fmt.Sprint(want.retried) ||
			field(ev, "previousErrorCode") != string(envelope.CodeWorkerLost) {
			t.Errorf("capability.retried %v, want attempt %d after WORKER_LOST", ev.Data, want.retried)
		}
	}
	if (want.retried > 0) != (retried == 1) {
		t.Errorf("%d capability.retried events; trail %v", retried, typesOf(tr))
	}
	if n := count(tr, audit.EventStarted); n != len(want.calls) {
		t.Errorf("%d capability.started events for %d calls", n, len(want.calls))
	}
}

// A live lease held by another worker is left alone: the delivery is put back
// until the lease ends, the record is not touched and the handler not called;
// then the lease has expired, and the execution is taken over.
func TestTakeoverTable_LiveLeaseLeftAloneUntilItExpires(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	s := newStore(t, env)
	id := envelope.NewExecutionID()
	leaseUntil := time.Now().UTC().Add(1500 * time.Millisecond)
	rev := s.putRecord(&execution.Record{ExecutionID: id, CapabilityID: "test.send", State: execution.StateClaimed,
		Worker: "other-worker", LeaseUntil: leaseUntil})
	s.publish("test.send", id)
	var p probe
	w := startWorker(t, env.Connect(t), executor.WorkerConfig{ID: "live-worker", Lease: 2 * time.Second}, sendCap(&p))

	// The worker has seen the delivery, and put it back.
	waitUntil(t, "the worker sees the delivery", func() bool { return w.Stats().Handled > 0 })
	for time.Now().Before(leaseUntil.Add(-500 * time.Millisecond)) {
		if _, got := s.record(id); got != rev || p.calls.Load() != 0 {
			t.Fatalf("the record moved (rev %d → %d) or the handler ran (%d) while another worker's lease was live",
				rev, got, p.calls.Load())
		}
		time.Sleep(50 * time.Millisecond)
	}

	got := s.await(id)
	tr := s.settled(id)
	checkTakeover(t, takeover{status: envelope.StatusCompleted, attempts: 1, calls: []int{1},
		takenFrom: execution.StateClaimed, from: "other-worker"}, got, tr, &p)
	ev, _ := find(tr, audit.EventTakenOver)
	if ev.Timestamp.Before(leaseUntil) {
		t.Fatalf("taken over at %v, before the lease ended at %v", ev.Timestamp, leaseUntil)
	}
}

// With lease renewal off, JetStream redelivers a slow attempt while it still
// runs. The redelivery reaches the worker running it: no second attempt of a
// non-idempotent capability, one envelope.
func TestRedeliveryWhileRunning_SameWorker_NoSecondAttempt(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	s := newStore(t, env)
	var w *executor.Worker
	var p probe
	redelivered := make(chan struct{})
	p.gate = func(ctx context.Context, _ int) {
		// Hold the attempt until JetStream has delivered the request again.
		for w.Stats().Handled < 2 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
		close(redelivered)
	}
	w = startWorker(t, env.Connect(t), testhooks.Worker(executor.WorkerConfig{ID: "slow-worker", Lease: time.Second}, noRenewal),
		sendCap(&p))
	id := envelope.NewExecutionID()
	s.publish("test.send", id)

	got := s.await(id)
	<-redelivered
	tr := s.settled(id)
	checkTakeover(t, takeover{status: envelope.StatusCompleted, attempts: 1, calls: []int{1}}, got, tr, &p)
	if n := s.envelopeWrites(); n != 1 {
		t.Fatalf("%d envelope writes", n)
	}
}

// The same with two workers: the redelivery reaches the other one, which finds
// the attempt's lease expired. A non-idempotent attempt is never repeated: the
// outcome is unknown, and the first worker's late result is refused and audited.
func TestRedeliveryWhileRunning_OtherWorker_NoSecondAttempt(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	s := newStore(t, env)
	id := envelope.NewExecutionID()
	var p probe
	p.gate = func(ctx context.Context, _ int) {
		// Hold the attempt until the other worker has finalized the execution.
		_, _ = s.c.Await(ctx, id)
	}
	cfg := testhooks.Worker(executor.WorkerConfig{Lease: time.Second}, noRenewal)
	cfg.ID = "worker-a"
	a := startWorker(t, env.Connect(t), cfg, sendCap(&p))
	cfg.ID = "worker-b"
	b := startWorker(t, env.Connect(t), cfg, sendCap(&p))
	s.publish("test.send", id)

	got := s.await(id)
	s.settled(id)
	s.waitEvent(id, audit.EventEnvelopeConflict)
	tr := s.trail(id)
	if p.calls.Load() != 1 {
		t.Fatalf("handler called %d times", p.calls.Load())
	}
	if got.Status != envelope.StatusFailed || got.Error == nil || got.Error.Code != envelope.CodeOutcomeUnknown {
		t.Fatalf("envelope %s %+v, want OUTCOME_UNKNOWN", got.Status, got.Error)
	}
	if n := s.envelopeWrites(); n != 1 {
		t.Fatalf("%d envelope writes", n)
	}
	conflict, _ := find(tr, audit.EventEnvelopeConflict)
	checkConflict(t, conflict, got)
	if field(conflict, "discardedStatus") != string(envelope.StatusCompleted) {
		t.Fatalf("envelope.conflict %v: the late result was not the one discarded", conflict.Data)
	}
	if st := a.Stats().Conflicts + b.Stats().Conflicts; st != 1 {
		t.Fatalf("%d conflicts counted", st)
	}
	if st := s.status(id); st.Record.State != execution.StateFinalized || st.Record.Status != got.Status {
		t.Fatalf("status %s/%s, envelope %s", st.Record.State, st.Record.Status, got.Status)
	}
}

// Two workers finalize the same execution at the same moment: one envelope;
// the loser's output is discarded and the conflict audited.
func TestConcurrentFinalization_OneEnvelope_LoserAudited(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	s := newStore(t, env)
	var p probe
	var arrived sync.WaitGroup
	arrived.Add(2)
	both := make(chan struct{})
	go func() { arrived.Wait(); close(both) }()
	p.gate = func(ctx context.Context, attempt int) {
		// Attempt 1 runs on one worker; it loses its lease (renewal is off) and
		// the other takes over with attempt 2. Both return together.
		arrived.Done()
		select {
		case <-both:
		case <-ctx.Done():
		}
	}
	cfg := testhooks.Worker(executor.WorkerConfig{Lease: time.Second}, noRenewal)
	cfg.ID = "worker-a"
	a := startWorker(t, env.Connect(t), cfg, lookupCap(&p))
	cfg.ID = "worker-b"
	b := startWorker(t, env.Connect(t), cfg, lookupCap(&p))
	id := envelope.NewExecutionID()
	s.publish("test.lookup", id)

	got := s.await(id)
	s.settled(id)
	conflict := s.waitEvent(id, audit.EventEnvelopeConflict)
	tr := s.trail(id)
	if calls := p.seen(); len(calls) != 2 {
		t.Fatalf("handler calls %v, want attempts 1 and 2", calls)
	}
	if n := s.envelopeWrites(); n != 1 {
		t.Fatalf("%d envelope writes, want 1", n)
	}
	if got.Status != envelope.StatusCompleted {
		t.Fatalf("envelope %s %+v", got.Status, got.Error)
	}
	// The stored output is the winner's own.
	var out probeOut
	if err := got.Output.Decode(&out); err != nil || out.Attempt != got.Attempts {
		t.Fatalf("output %+v of an envelope with %d attempts (%v)", out, got.Attempts, err)
	}
	checkConflict(t, conflict, got)
	if n := count(tr, audit.EventEnvelopeConflict); n != 1 {
		t.Fatalf("%d envelope.conflict events", n)
	}
	if st := a.Stats().Conflicts + b.Stats().Conflicts; st != 1 {
		t.Fatalf("%d conflicts counted", st)
	}
	if st := s.status(id); st.Record.State != execution.StateFinalized || st.Record.Status != got.Status || st.Record.Attempt != got.Attempts {
		t.Fatalf("status %+v, envelope %s after %d", st.Record, got.Status, got.Attempts)
	}
}

// checkConflict checks that a refused finalization was audited by the loser,
// naming the worker whose envelope stands.
func checkConflict(t *testing.T, conflict audit.Event, got *envelope.Envelope) {
	t.Helper()
	winner := ""
	switch field(conflict, "reason") {
	case "claim-lost": // the loser found the record another worker's
		winner = field(conflict, "owner")
	case "envelope-exists": // the bucket refused the loser's envelope
		winner = field(conflict, "finalizedBy")
	}
	if conflict.Worker == "" || conflict.Worker == got.FinalizedBy || winner != got.FinalizedBy {
		t.Fatalf("envelope.conflict by %s %v; envelope by %s", conflict.Worker, conflict.Data, got.FinalizedBy)
	}
}

// One envelope per execution: a worker that owns the execution finalizes
// after another worker, stalled past its lease, wrote its envelope late. The
// create-only bucket refuses the second envelope (the first stays, the bucket
// stored one write), the output is discarded and audited as envelope.conflict,
// and the record tells what the stored envelope says.
func TestOneEnvelopePerExecution_SecondFinalizationRefusedAndAudited(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	s := newStore(t, env)
	id := envelope.NewExecutionID()
	s.putRecord(&execution.Record{ExecutionID: id, CapabilityID: "test.lookup", State: execution.StateRunning, Attempt: 1,
		Worker: deadWorker, LeaseUntil: pastLease(), StartedAt: pastLease()})
	var p probe
	p.gate = func(ctx context.Context, attempt int) {
		// The stalled worker's write lands while this attempt runs.
		late := &envelope.Envelope{V: envelope.Version, ExecutionID: id, CapabilityID: "test.lookup",
			Status: envelope.StatusCompleted, Output: envelope.MustRaw(probeOut{Attempt: 1}), Attempts: 1,
			FinalizedBy: deadWorker, FinalizedAt: time.Now().UTC()}
		if _, err := broker.Create(ctx, s.b.Envelopes, broker.Key(broker.Anonymous, id), late); err != nil {
			t.Errorf("late envelope: %v", err)
		}
	}
	s.publish("test.lookup", id)
	w := startWorker(t, env.Connect(t), executor.WorkerConfig{ID: "live-worker", Lease: 2 * time.Second}, lookupCap(&p))

	s.await(id)
	tr := s.settled(id)
	got := s.storedEnvelope(id)
	if n := s.envelopeWrites(); n != 1 || got.FinalizedBy != deadWorker || got.Attempts != 1 {
		t.Fatalf("the bucket stored %d envelope writes, the last by %s after %d attempts: the second finalization must be refused, the first envelope kept",
			n, got.FinalizedBy, got.Attempts)
	}
	conflict, ok := find(tr, audit.EventEnvelopeConflict)
	if !ok {
		t.Fatalf("no envelope.conflict event for the refused finalization; trail %v", typesOf(tr))
	}
	checkConflict(t, conflict, got)
	if field(conflict, "reason") != "envelope-exists" || field(conflict, "discardedAttempts") != "2" {
		t.Fatalf("envelope.conflict %v", conflict.Data)
	}
	if w.Stats().Conflicts != 1 || p.calls.Load() != 1 {
		t.Fatalf("conflicts %d, calls %d", w.Stats().Conflicts, p.calls.Load())
	}
	if st := s.status(id); st.Record.State != execution.StateFinalized || st.Record.Status != got.Status || st.Record.Attempt != got.Attempts {
		t.Fatalf("status %+v, envelope %s after %d", st.Record, got.Status, got.Attempts)
	}
}

// A worker that shuts down with an attempt still running gives its lease back:
// another worker takes the execution over at once instead of waiting for the
// lease to run out.
func TestShutdown_ReleasesLeaseToTakeover(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	s := newStore(t, env)
	const lease = time.Minute // far longer than the test may wait
	var p probe
	started := make(chan struct{}, 2)
	p.gate = func(ctx context.Context, attempt int) {
		started <- struct{}{}
		if attempt == 1 {
			<-ctx.Done() // held until its worker gives up on it
		}
	}
	reg, err := executor.NewRegistry(lookupCap(&p))
	if err != nil {
		t.Fatal(err)
	}
	first, err := executor.NewWorker(env.Connect(t), reg, executor.WorkerConfig{ID: "leaving", Lease: lease, Grace: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- first.Run(ctx) }()
	id := envelope.NewExecutionID()
	s.publish("test.lookup", id)
	<-started
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	rec, _ := s.record(id)
	if rec.State != execution.StateRunning || rec.Worker != "leaving" || rec.LeaseUntil.After(time.Now()) {
		t.Fatalf("record after shutdown %+v: want running, its lease given back", rec)
	}

	startWorker(t, env.Connect(t), executor.WorkerConfig{ID: "staying", Lease: lease}, lookupCap(&p))
	aw, cancel := context.WithTimeout(context.Background(), lease/2)
	defer cancel()
	got, err := s.c.Await(aw, id)
	if err != nil {
		t.Fatalf("no envelope while the released lease would still have been live: %v", err)
	}
	tr := s.settled(id)
	if got.Status != envelope.StatusCompleted || got.Attempts != 2 || got.FinalizedBy != "staying" {
		t.Fatalf("envelope %s after %d attempts by %s", got.Status, got.Attempts, got.FinalizedBy)
	}
	ev, ok := find(tr, audit.EventRetried)
	if !ok || field(ev, "previousErrorCode") != string(envelope.CodeWorkerLost) {
		t.Fatalf("retried %+v; trail %v", ev, typesOf(tr))
	}
}

// A request for a capability no worker serves any more, whose execution a lost
// worker had started, still ends with one envelope: the record is decided as
// the takeover table says, never acknowledged without an envelope.
func TestUnservedCapability_StartedByLostWorker_OutcomeUnknown(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	s := newStore(t, env)
	var p probe
	// An older worker served test.send in this pool; it is gone, and so is the
	// capability's catalog entry. The pool's consumer still lists its subject.
	oldConn := env.Connect(t)
	old := startWorkerUntil(t, oldConn, executor.WorkerConfig{ID: "old"}, sendCap(&p), lookupCap(&p))
	s.waitFilter("pool-default", s.b.Names.ExecFilter("test.send"))
	old()
	// Its process ends: the server forgets the pulls it left waiting.
	oldConn.Close()
	if err := s.b.Catalog.Purge(ctxT(t), "test.send"); err != nil {
		t.Fatal(err)
	}
	id := envelope.NewExecutionID()
	s.putRecord(&execution.Record{ExecutionID: id, CapabilityID: "test.send", State: execution.StateRunning, Attempt: 1,
		Worker: deadWorker, LeaseUntil: pastLease(), StartedAt: pastLease()})
	s.publish("test.send", id)
	startWorker(t, env.Connect(t), executor.WorkerConfig{ID: "new"}, lookupCap(&p))

	got := s.await(id)
	s.settled(id)
	if got.Status != envelope.StatusFailed || got.Error == nil || got.Error.Code != envelope.CodeOutcomeUnknown || got.Attempts != 1 {
		t.Fatalf("envelope %s %+v after %d attempts", got.Status, got.Error, got.Attempts)
	}
	if p.calls.Load() != 0 {
		t.Fatalf("handler called")
	}
}

// waitFilter waits until a worker has widened the consumer to subject.
func (s *store) waitFilter(consumer, subject string) {
	s.t.Helper()
	ctx := ctxT(s.t)
	for {
		if c, err := s.b.Exec.Consumer(ctx, consumer); err == nil {
			cfg := c.CachedInfo().Config
			if cfg.FilterSubject == subject || slices.Contains(cfg.FilterSubjects, subject) {
				return
			}
		}
		select {
		case <-ctx.Done():
			s.t.Fatalf("consumer %s never filtered %s", consumer, subject)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// startWorkerUntil runs a worker and returns the function that stops it.
func startWorkerUntil(t *testing.T, nc *nats.Conn, cfg executor.WorkerConfig, caps ...executor.Capability) func() {
	t.Helper()
	return runWorkerOn(t, nc, cfg, caps...).Stop
}

// A worker whose lease ran out while its handler ran, and whose execution
// another worker took over, discards its late result: before the envelope, a
// CAS on the record proves the claim is still its own. Here the late result
// arrives while the new owner's attempt is still running, so the create-only
// envelope alone would not refuse it.
func TestFinalize_LostClaimDiscardsTheLateResult_NewOwnerFinalizes(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	s := newStore(t, env)
	id := envelope.NewExecutionID()
	key := broker.Key(broker.Anonymous, id)
	var a, b *executor.Worker
	second := make(chan struct{})
	var p probe
	p.gate = func(ctx context.Context, attempt int) {
		if attempt == 1 {
			// Return once the other worker runs attempt 2.
			select {
			case <-second:
			case <-ctx.Done():
			}
			return
		}
		close(second)
		// Hold attempt 2 until the first worker has dealt with its result:
		// discarded it (a conflict) or, wrongly, stored it.
		for a.Stats().Conflicts+b.Stats().Conflicts == 0 {
			if _, err := s.b.Envelopes.Get(ctx, key); err == nil {
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	// Renewal is off: the first worker's lease runs out under its handler.
	cfg := testhooks.Worker(executor.WorkerConfig{Lease: time.Second}, noRenewal)
	cfg.ID = "worker-a"
	a = startWorker(t, env.Connect(t), cfg, lookupCap(&p))
	cfg.ID = "worker-b"
	b = startWorker(t, env.Connect(t), cfg, lookupCap(&p))
	s.publish("test.lookup", id)

	got := s.await(id)
	s.settled(id)
	conflict := s.waitEvent(id, audit.EventEnvelopeConflict)
	if calls := p.seen(); len(calls) != 2 {
		t.Fatalf("handler calls %v, want attempts 1 and 2", calls)
	}
	var out probeOut
	if err := got.Output.Decode(&out); err != nil || got.Status != envelope.StatusCompleted || got.Attempts != 2 || out.Attempt != 2 {
		t.Fatalf("envelope %s after %d attempts, output %+v (%v): want the new owner's attempt 2", got.Status, got.Attempts, out, err)
	}
	if field(conflict, "reason") != "claim-lost" {
		t.Fatalf("conflict %v, want the late result discarded for a lost claim", conflict.Data)
	}
	// The takeover continues the execution: one capability.requested.
	if tr := s.trail(id); count(tr, audit.EventRequested) != 1 {
		t.Fatalf("%d capability.requested events; trail %v", count(tr, audit.EventRequested), typesOf(tr))
	}
	if n := s.envelopeWrites(); n != 1 {
		t.Fatalf("%d envelope writes, want 1", n)
	}
}

// A handler that runs longer than a lease keeps it: the worker renews the
// lease, so no other worker takes the execution over and the handler's
// context does not end.
func TestLease_RenewedWhileTheHandlerRuns_NoTakeover(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	s := newStore(t, env)
	id := envelope.NewExecutionID()
	started, release := make(chan struct{}), make(chan struct{})
	var ended atomic.Bool
	var p probe
	p.gate = func(ctx context.Context, _ int) {
		close(started)
		select {
		case <-release:
		case <-ctx.Done():
		}
		ended.Store(ctx.Err() != nil)
	}
	cfg := executor.WorkerConfig{Lease: time.Second}
	cfg.ID = "worker-a"
	startWorker(t, env.Connect(t), cfg, sendCap(&p))
	cfg.ID = "worker-b"
	startWorker(t, env.Connect(t), cfg, sendCap(&p))
	s.publish("test.send", id)
	waitClosed(t, started, "the handler never started")
	first, _ := s.record(id)
	// Hold the handler until the lease it started with has run out and the
	// record shows a later one.
	ctx := ctxT(t)
	for {
		rec, _ := s.record(id)
		if time.Now().After(first.LeaseUntil) && rec.LeaseUntil.After(first.LeaseUntil) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the lease was never renewed: record %+v", rec)
		case <-time.After(20 * time.Millisecond):
		}
	}
	close(release)
	got := s.await(id)
	tr := s.settled(id)
	if ended.Load() {
		t.Fatal("the handler's context ended while its lease was renewed")
	}
	checkTakeover(t, takeover{status: envelope.StatusCompleted, attempts: 1, calls: []int{1}}, got, tr, &p)
}

// sendHeldAtPolicies runs a worker "w" (lease 1 s) serving test.send, whose
// one policy holds its first evaluation, publishes id's request, and returns
// once the policy holds it; closing the returned channel lets it go on.
func (s *store) sendHeldAtPolicies(env *testenv.Env, id string, p *probe) (release chan struct{}) {
	t := s.t
	t.Helper()
	evaluating, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	hold := executor.Policy{Name: "held-once", Evaluate: func(ctx context.Context, _ executor.PolicyRequest) (executor.Decision, error) {
		once.Do(func() {
			close(evaluating)
			select {
			case <-release:
			case <-ctx.Done():
			}
		})
		return executor.Decision{Stance: executor.StanceAllow}, nil
	}}
	send := executor.Define("test.send", executor.Meta{
		Description: "Sends something; never retried.",
		Expose:      executor.On(executor.SurfaceDirect),
		SideEffect:  executor.SideEffectExternal,
		Policies:    []executor.Policy{hold},
	}, func(ctx context.Context, c executor.Call[map[string]any]) (probeOut, error) {
		p.called(ctx, c.Attempt)
		return probeOut{Attempt: c.Attempt}, ctx.Err()
	})
	startWorker(t, env.Connect(t), executor.WorkerConfig{ID: "w", Lease: time.Second, PolicyTimeout: time.Hour}, send)
	s.publish("test.send", id)
	waitClosed(t, evaluating, "the policy was never evaluated")
	return release
}

// An attempt starts only with a CAS on the record that proves the claim is
// still this delivery's: a worker whose claim was taken over while its
// policies ran never calls the handler; the new owner runs the one attempt.
func TestAttemptStart_ClaimTakenOverMeanwhile_HandlerNotCalled(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	s := newStore(t, env)
	// An id that is not a UUIDv7 takes the path that claims before stage 4.
	id := "attempt-start-" + envelope.NewExecutionID()[:8]
	var p probe
	release := s.sendHeldAtPolicies(env, id, &p)
	// Another claim takes the record over (its lease already out, so that the
	// redelivery may take it back) while the policy runs.
	rec, rev := s.record(id)
	rec.Worker, rec.Claim, rec.LeaseUntil = "other-worker", "other-claim", pastLease()
	if _, err := broker.Update(ctxT(t), s.b.Executions, broker.Key(broker.Anonymous, id), rec, rev); err != nil {
		t.Fatal(err)
	}
	close(release)

	got := s.await(id)
	tr := s.settled(id)
	checkTakeover(t, takeover{status: envelope.StatusCompleted, attempts: 1, calls: []int{1}, takenFrom: execution.StateClaimed,
		from: "other-worker"}, got, tr, &p)
	if n := count(tr, audit.EventRequested); n != 1 {
		t.Fatalf("%d capability.requested events; trail %v", n, typesOf(tr))
	}
}

// The short path (DESIGN §14) runs stages 4 to 9 before any write, and its
// attempt's record is create-only: a record another claim created meanwhile
// makes the create fail, and the takeover table decides from that record.
func TestShortPath_RecordCreatedWhilePoliciesRan_TakeoverTableDecides(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	s := newStore(t, env)
	id := envelope.NewExecutionID()
	var p probe
	release := s.sendHeldAtPolicies(env, id, &p)
	// The short path writes nothing before its attempt starts: another claim
	// creates the record (its lease already out) while the policy runs.
	if _, err := s.b.Executions.Get(ctxT(t), broker.Key(broker.Anonymous, id)); err == nil {
		t.Fatal("a record exists before the attempt started")
	}
	s.putRecord(&execution.Record{ExecutionID: id, CapabilityID: "test.send", State: execution.StateClaimed,
		Worker: "other-worker", Claim: "other-claim", LeaseUntil: pastLease()})
	close(release)

	got := s.await(id)
	tr := s.settled(id)
	checkTakeover(t, takeover{status: envelope.StatusCompleted, attempts: 1, calls: []int{1}, takenFrom: execution.StateClaimed,
		from: "other-worker"}, got, tr, &p)
	// The events the short path held before its claim are dropped: the
	// record's owner audits the request.
	if n := count(tr, audit.EventRequested); n != 0 {
		t.Fatalf("%d capability.requested events; trail %v", n, typesOf(tr))
	}
}

// An envelope that is there but does not decode still means the execution
// ended: the delivery is acknowledged as a duplicate, never a new attempt,
// and the stored bytes are left as they are.
func TestUndecodableEnvelope_DuplicateAcknowledgedNoAttempt(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	s := newStore(t, env)
	id := envelope.NewExecutionID()
	key := broker.Key(broker.Anonymous, id)
	s.putRecord(&execution.Record{ExecutionID: id, CapabilityID: "test.send", State: execution.StateRunning, Attempt: 1,
		Worker: deadWorker, LeaseUntil: pastLease(), StartedAt: pastLease()})
	garbage := []byte("not an envelope")
	if _, err := s.b.Envelopes.Create(ctxT(t), key, garbage); err != nil {
		t.Fatal(err)
	}
	var p probe
	w := startWorker(t, env.Connect(t), executor.WorkerConfig{ID: "live-worker", Lease: time.Second, SweepInterval: -1},
		sendCap(&p))
	s.publish("test.send", id)
	s.drained() // acknowledged: the exec stream holds nothing
	if n := w.Stats().Duplicates; n != 1 {
		t.Fatalf("%d duplicates counted, want 1", n)
	}
	if n := p.calls.Load(); n != 0 {
		t.Fatalf("handler called %d times", n)
	}
	if e, err := s.b.Envelopes.Get(ctxT(t), key); err != nil || string(e.Value()) != string(garbage) || s.envelopeWrites() != 1 {
		t.Fatalf("stored envelope changed: %v", err)
	}
}

// The sweeper meets a request that already ended NOT_STARTED (its worker was
// lost before removing it): the envelope there is never written again.
func TestSweeper_NotStartedEnvelopeThere_NeverRewritten(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	s := newStore(t, env)
	id := envelope.NewExecutionID()
	key := broker.Key(broker.Anonymous, id)
	s.putRecord(&execution.Record{ExecutionID: id, CapabilityID: "test.send", State: execution.StateFinalized,
		Worker: deadWorker, Status: envelope.StatusFailed, LastError: envelope.CodeNotStarted})
	done := &envelope.Envelope{V: envelope.Version, ExecutionID: id, CapabilityID: "test.send", Status: envelope.StatusFailed,
		Error: &envelope.Error{Code: envelope.CodeNotStarted, Stage: envelope.StageQueue, ExposeToModel: true,
			Message: "No worker started the operation before its start deadline; it never ran."}, FinalizedBy: deadWorker, FinalizedAt: pastLease()}
	if _, err := broker.Create(ctxT(t), s.b.Envelopes, key, done); err != nil {
		t.Fatal(err)
	}
	startBy := pastLease()
	s.publishRequest(s.b.Names.ExecSubject(broker.Anonymous, "test.send"), &envelope.Request{ExecutionID: id,
		CapabilityID: "test.send", StartBy: &startBy})
	// Only a sweeper sees it: no pool serves test.send.
	s.runWorker(env.Connect(t), executor.WorkerConfig{Pool: "other", SweepInterval: 50 * time.Millisecond}, echoCap(nil))
	s.drained()
	got := s.await(id)
	if got.FinalizedBy != deadWorker || s.envelopeWrites() != 1 {
		t.Fatalf("envelope finalized by %s after %d writes, want %s's only", got.FinalizedBy, s.envelopeWrites(), deadWorker)
	}
}

// The envelope is created before the request is acknowledged (DESIGN §5): a
// worker that cannot write its envelope leaves the request in the stream,
// and the next worker that receives it ends it (here OUTCOME_UNKNOWN: the
// attempt ran, its result was never stored), never a second attempt. An
// acknowledgement sent first would lose the request with no envelope.
func TestEnvelopeNotWritten_RequestStaysQueuedForTheNextWorker(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	s := newStore(t, env)
	id := envelope.NewExecutionID()
	started, release := make(chan struct{}), make(chan struct{})
	var p probe
	p.gate = func(ctx context.Context, attempt int) {
		if attempt == 1 {
			close(started)
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
	}
	cfg := executor.WorkerConfig{ID: "refused", Lease: time.Second, Grace: 50 * time.Millisecond, SweepInterval: -1}
	first, stop := runWorker(t, env.Connect(t), cfg, sendCap(&p))
	s.publish("test.send", id)
	waitClosed(t, started, "the handler never started")
	envelopes := "KV_" + s.b.Names.EnvelopesBucket()
	size := s.setMaxMsgSize(envelopes, 1)
	close(release)
	// The outcome is on the trail before its envelope is tried.
	s.waitEvent(id, audit.EventCompleted)
	stop() // the worker gives up on the envelope as it shuts down
	if n := first.Stats().Finalized; n != 0 {
		t.Fatalf("%d envelopes written into a bucket that refuses them", n)
	}
	info, err := s.b.Exec.Info(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 1 {
		t.Fatalf("the exec stream holds %d requests after an envelope that was never written, want 1", info.State.Msgs)
	}

	s.setMaxMsgSize(envelopes, size)
	cfg.ID = "next"
	startWorker(t, env.Connect(t), cfg, sendCap(&p))
	got := s.await(id)
	s.settled(id)
	if got.Status != envelope.StatusFailed || got.Error == nil || got.Error.Code != envelope.CodeOutcomeUnknown || got.FinalizedBy != "next" {
		t.Fatalf("envelope %s by %s, error %+v; want OUTCOME_UNKNOWN by the next worker", got.Status, got.FinalizedBy, got.Error)
	}
	if n := p.calls.Load(); n != 1 {
		t.Fatalf("handler called %d times, want the one attempt", n)
	}
}

// setAllowDirect turns a stream's direct gets on or off. A client bound
// while they were on keeps sending them: off, its reads of the stream fail
// (nobody answers) while every other stream answers.
func (s *store) setAllowDirect(stream string, on bool) {
	s.t.Helper()
	st, err := s.b.JS.Stream(ctxT(s.t), stream)
	if err != nil {
		s.t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	cfg.AllowDirect = on
	if _, err := s.b.JS.UpdateStream(ctxT(s.t), cfg); err != nil {
		s.t.Fatalf("stream %s: allow direct %v: %v", stream, on, err)
	}
}

// An envelope that cannot be read is not an absent one (DESIGN §5): a
// delivery that finds a lost worker's attempt while the envelopes do not
// answer waits for them, never takes the execution over (the attempt may
// have ended); once they answer, it finds the envelope and acknowledges a
// duplicate.
func TestTakeoverTable_EnvelopeUnreadable_WaitsNeverANewAttempt(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	s := newStore(t, env)
	id := envelope.NewExecutionID()
	key := broker.Key(broker.Anonymous, id)
	s.putRecord(&execution.Record{ExecutionID: id, CapabilityID: "test.lookup", State: execution.StateRunning, Attempt: 1,
		Worker: deadWorker, Claim: "dead-claim", LeaseUntil: pastLease(), StartedAt: pastLease()})
	done := &envelope.Envelope{V: envelope.Version, ExecutionID: id, CapabilityID: "test.lookup", Status: envelope.StatusCompleted,
		Output: envelope.MustRaw(probeOut{Attempt: 1}), Attempts: 1, FinalizedBy: deadWorker, FinalizedAt: pastLease()}
	if _, err := broker.Create(ctxT(t), s.b.Envelopes, key, done); err != nil {
		t.Fatal(err)
	}
	var p probe
	w := startWorker(t, env.Connect(t), executor.WorkerConfig{ID: "live-worker", Lease: time.Second, SweepInterval: -1},
		lookupCap(&p))
	envelopes := "KV_" + s.b.Names.EnvelopesBucket()
	s.setAllowDirect(envelopes, false)
	s.publish("test.lookup", id)
	// Put back, the delivery comes again: the first one has been decided.
	waitUntil(t, "a second delivery, or a handler call", func() bool { return w.Stats().Handled >= 2 || p.calls.Load() > 0 })
	if n := p.calls.Load(); n != 0 {
		t.Fatalf("handler called %d times while the envelope could not be read", n)
	}
	s.setAllowDirect(envelopes, true)
	s.drained()
	if n := w.Stats().Duplicates; n == 0 || p.calls.Load() != 0 {
		t.Fatalf("%d duplicates counted, %d handler calls; want the delivery acknowledged as a duplicate", n, p.calls.Load())
	}
	if got := s.storedEnvelope(id); got.FinalizedBy != deadWorker || s.envelopeWrites() != 1 {
		t.Fatalf("envelope rewritten by %s", got.FinalizedBy)
	}
}

// A takeover is its claim's compare-and-swap: a delivery whose claim is not
// written (the store refuses it here; another worker taking the execution
// first alike) neither runs nor audits anything, and is put back; the
// delivery after the store answers again takes the execution over and runs
// its one attempt.
func TestTakeoverTable_ClaimNotWritten_NothingRunNothingAudited(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	s := newStore(t, env)
	id := envelope.NewExecutionID()
	s.putRecord(&execution.Record{ExecutionID: id, CapabilityID: "test.send", State: execution.StateClaimed,
		Worker: deadWorker, Claim: "dead-claim", LeaseUntil: pastLease()})
	var p probe
	w := startWorker(t, env.Connect(t), executor.WorkerConfig{ID: "live-worker", Lease: time.Second, SweepInterval: -1},
		sendCap(&p))
	records := "KV_" + s.b.Names.ExecutionsBucket()
	size := s.setMaxMsgSize(records, 1)
	s.publish("test.send", id)
	// Put back, the delivery comes again: the first one has been decided.
	waitUntil(t, "a second delivery, or a handler call", func() bool { return w.Stats().Handled >= 2 || p.calls.Load() > 0 })
	flushAudit(t)
	if tr := s.trail(id); p.calls.Load() != 0 || len(tr) != 0 {
		t.Fatalf("%d handler calls, trail %v, while the claim could not be written", p.calls.Load(), typesOf(tr))
	}
	s.setMaxMsgSize(records, size)
	got := s.await(id)
	checkTakeover(t, takeover{status: envelope.StatusCompleted, attempts: 1, calls: []int{1}, takenFrom: execution.StateClaimed},
		got, s.settled(id), &p)
	if tr := s.trail(id); count(tr, audit.EventTakenOver) != 1 {
		t.Fatalf("%d taken_over events; trail %v", count(tr, audit.EventTakenOver), typesOf(tr))
	}
}

// noRenewal stops lease renewal, so that JetStream redelivers a long
// execution while it runs.
var noRenewal = testhooks.WorkerKnobs{DisableLeaseRenewal: true}
