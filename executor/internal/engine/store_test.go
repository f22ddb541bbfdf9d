package engine

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/auditemit"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/google/uuid"
)

// The claim store's wiring against a real JetStream: a compare-and-swap
// that another claim beat is lost, never applied over it; a cancel set
// meanwhile is read; the sweeper's takeover that loses its swap writes
// nothing. The rules are the pure tables' (takeover_test.go, rules_test.go);
// these prove that the store carries them out.

// testRunner is a runner on its own embedded server, provisioned, serving
// nothing.
func testRunner(t *testing.T) *Runner {
	t.Helper()
	env := testenv.Start(t)
	nc := env.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := broker.Provision(ctx, nc, broker.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	r := NewRunner(nc, slog.New(slog.DiscardHandler), Config{ID: "w-test", Lease: 30 * time.Second})
	r.Provisioned(b, auditemit.New(b.NC, auditemit.Options{Prefix: b.Names.Prefix(), Audit: b.Audit, Index: b.Index, Logger: slog.New(slog.DiscardHandler)}))
	t.Cleanup(r.Stop)
	return r
}

// newClaim is a claim of key on r's store with a token of its own.
func (r *Runner) newClaim(key string) *claim {
	return &claim{s: r.w.store, key: key, token: uuid.NewString()}
}

func claimRecord(id, worker, token string, st State, leaseUntil time.Time) *Record {
	now := time.Now().UTC()
	return &Record{V: envelope.Version, ExecutionID: id, CapabilityID: "email.send", State: st, Worker: worker,
		Claim: token, LeaseUntil: leaseUntil, CreatedAt: now, UpdatedAt: now}
}

// runningClaim is a new execution's record, running under a claim of
// worker w1 on r's store, its lease until leaseUntil: its id, key and claim.
func (r *Runner) runningClaim(t *testing.T, leaseUntil time.Time) (string, string, *claim) {
	t.Helper()
	id := envelope.NewExecutionID()
	key := broker.Key(broker.Anonymous, id)
	mine := r.newClaim(key)
	if _, _, ok := mine.create(claimRecord(id, "w1", mine.token, StateRunning, leaseUntil), noStage{}); !ok {
		t.Fatal("create")
	}
	return id, key, mine
}

// noStage observes nothing.
type noStage struct{}

func (noStage) stage(string) func(error) { return func(error) {} }

func TestClaim_CreateFindsAnotherClaimsRecord(t *testing.T) {
	t.Parallel()
	r := testRunner(t)
	id := envelope.NewExecutionID()
	key := broker.Key(broker.Anonymous, id)
	first, second := r.newClaim(key), r.newClaim(key)
	lease := time.Now().Add(time.Minute)
	if found, _, ok := first.create(claimRecord(id, "w1", first.token, StateClaimed, lease), noStage{}); !ok || found != nil {
		t.Fatalf("first create: ok %v, found %+v", ok, found)
	}
	found, rev, ok := second.create(claimRecord(id, "w2", second.token, StateRunning, lease), noStage{})
	if ok || found == nil || found.Claim != first.token || found.State != StateClaimed || rev == 0 {
		t.Fatalf("second create: ok %v, found %+v at %d; want the first claim's record", ok, found, rev)
	}
	if second.held() != nil {
		t.Fatalf("the second claim holds %+v", second.held())
	}
}

func TestClaim_UpdateAfterAnotherClaimTookIt_LostNotApplied(t *testing.T) {
	t.Parallel()
	r := testRunner(t)
	_, key, mine := r.runningClaim(t, time.Now().Add(time.Second))
	// Another worker takes it over, its lease having run out.
	other := r.newClaim(key)
	cur, rev, err := r.w.store.load(key)
	if err != nil {
		t.Fatal(err)
	}
	other.hold(cur, rev)
	if err := other.update(func(rec *Record) { rec.Worker, rec.Claim = "w2", other.token }); err != nil {
		t.Fatal(err)
	}
	err = mine.update(func(rec *Record) { rec.State, rec.Attempt = StateRunning, 2 })
	if !errors.Is(err, errLost) {
		t.Fatalf("update after a takeover: %v, want errLost", err)
	}
	got, _, err := r.w.store.load(key)
	if err != nil || got.Claim != other.token || got.Attempt != 0 {
		t.Fatalf("record %+v (%v): want the other claim's, unchanged", got, err)
	}
}

func TestClaim_UpdateReadsACancelRecordedMeanwhile(t *testing.T) {
	t.Parallel()
	r := testRunner(t)
	id, key, mine := r.runningClaim(t, time.Now().Add(time.Minute))
	if c, err := r.RecordCancel(broker.Anonymous, id, true); err != nil || c.Finalized || c.State != StateRunning {
		t.Fatalf("cancel: %+v, %v", c, err)
	}
	until := time.Now().UTC().Add(2 * time.Minute)
	err := mine.update(func(rec *Record) { rec.LeaseUntil = until })
	if !errors.Is(err, errCancelRequested) {
		t.Fatalf("renewal after a cancel: %v, want errCancelRequested", err)
	}
	got, _, _ := r.w.store.load(key)
	if !got.CancelRequested || !got.LeaseUntil.Equal(until) || got.Claim != mine.token {
		t.Fatalf("record %+v: want the cancel kept and the renewal applied", got)
	}
}

// The sweeper's takeover is a compare-and-swap like a worker's: when
// another worker moved first, it writes neither the record nor an envelope,
// which could otherwise say NOT_STARTED of a request the other one runs.
func TestEndTaken_SwapLost_NothingWritten(t *testing.T) {
	t.Parallel()
	r := testRunner(t)
	id := envelope.NewExecutionID()
	key := broker.Key(broker.Anonymous, id)
	dead := r.newClaim(key)
	if _, _, ok := dead.create(claimRecord(id, "w-dead", dead.token, StateClaimed, time.Now().Add(-time.Second)), noStage{}); !ok {
		t.Fatal("create")
	}
	stale, staleRev, err := r.w.store.load(key)
	if err != nil {
		t.Fatal(err)
	}
	// A pool's worker takes it over first.
	worker := r.newClaim(key)
	worker.hold(stale, staleRev)
	if err := worker.update(func(rec *Record) {
		rec.Worker, rec.Claim, rec.LeaseUntil = "w-live", worker.token, time.Now().UTC().Add(time.Minute)
	}); err != nil {
		t.Fatal(err)
	}
	_, rev, _ := r.w.store.load(key)
	req := &envelope.Request{ExecutionID: id, CapabilityID: "email.send"}
	if r.EndTaken(context.Background(), req, broker.Anonymous, stale, staleRev, NotStartedError(), 0) {
		t.Fatal("EndTaken reported an end over another worker's claim")
	}
	if env, err := r.w.store.envelope(key); env != nil || err != nil {
		t.Fatalf("envelope %+v (%v) written over a claim the sweeper lost", env, err)
	}
	if got, gotRev, _ := r.w.store.load(key); gotRev != rev || got.Claim != worker.token {
		t.Fatalf("record %+v at %d, want the worker's at %d", got, gotRev, rev)
	}
}

// A cancel of an execution whose envelope exists changes nothing, even
// while its record still says running (the record is not written after the
// envelope): the answer is the envelope's status.
func TestRecordCancel_EnvelopeThere_NothingRecorded(t *testing.T) {
	t.Parallel()
	r := testRunner(t)
	id := envelope.NewExecutionID()
	key := broker.Key(broker.Anonymous, id)
	c := r.newClaim(key)
	if _, _, ok := c.create(claimRecord(id, "w1", c.token, StateRunning, time.Now().Add(time.Minute)), noStage{}); !ok {
		t.Fatal("create")
	}
	_, rev, _ := r.w.store.load(key)
	env := &envelope.Envelope{V: envelope.Version, ExecutionID: id, CapabilityID: "email.send", Status: envelope.StatusCompleted,
		Attempts: 1, FinalizedBy: "w1", FinalizedAt: time.Now().UTC()}
	if err := r.w.store.createEnvelope(key, env, sealed{}); err != nil {
		t.Fatal(err)
	}
	got, err := r.RecordCancel(broker.Anonymous, id, true)
	if err != nil || !got.Finalized || got.Status != envelope.StatusCompleted {
		t.Fatalf("cancel after the envelope: %+v, %v; want finalized, completed", got, err)
	}
	if rec, gotRev, _ := r.w.store.load(key); gotRev != rev || rec.CancelRequested {
		t.Fatalf("record %+v at %d: a cancel was recorded on an ended execution (was %d)", rec, gotRev, rev)
	}
}

// A renewal that finds another claim in the record ends the execution at
// once (DESIGN §5: a worker that loses its lease cancels its handler's
// context), without waiting for its own lease to run out; and the claim
// writes nothing more.
func TestLeaseKeeper_RenewalFindingAnotherClaim_EndsTheExecutionAtOnce(t *testing.T) {
	t.Parallel()
	r := testRunner(t)
	_, key, mine := r.runningClaim(t, time.Now().Add(time.Hour))
	other := r.newClaim(key)
	cur, rev, _ := r.w.store.load(key)
	other.hold(cur, rev)
	if err := other.update(func(rec *Record) { rec.Worker, rec.Claim = "w2", other.token }); err != nil {
		t.Fatal(err)
	}
	ctx, end := context.WithCancelCause(context.Background())
	defer end(nil)
	l := &leaseKeeper{claim: mine, length: time.Hour, now: time.Now, end: end, lost: end, log: slog.New(slog.DiscardHandler),
		stop: make(chan struct{})}
	if l.renew() {
		t.Fatal("a renewal that found another claim reported the execution still this worker's")
	}
	if !errors.Is(context.Cause(ctx), errLeaseLost) {
		t.Fatalf("the execution's context: %v, want ended with errLeaseLost (its lease still had an hour)", context.Cause(ctx))
	}
	if !mine.lapsed.Load() {
		t.Fatal("the lost claim may still write")
	}
}

// A claim whose lease ran out unrenewed writes nothing more, even where the
// record still names it: another worker may be taking it over, and its
// handler's context has ended.
func TestClaim_LapsedLease_WritesNothingMore(t *testing.T) {
	t.Parallel()
	r := testRunner(t)
	id, key, mine := r.runningClaim(t, time.Now().Add(time.Second))
	// A cancel moves the revision, not the claim; then the lease lapses.
	if _, err := r.RecordCancel(broker.Anonymous, id, true); err != nil {
		t.Fatal(err)
	}
	_, rev, _ := r.w.store.load(key)
	mine.lapsed.Store(true)
	if err := mine.update(func(rec *Record) { rec.LeaseUntil = time.Now().UTC().Add(time.Hour) }); !errors.Is(err, errLost) {
		t.Fatalf("a renewal after the lease lapsed: %v, want errLost", err)
	}
	if _, got, _ := r.w.store.load(key); got != rev {
		t.Fatalf("record at revision %d, want %d: a lapsed claim wrote", got, rev)
	}
}
