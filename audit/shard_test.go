package audit_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/auditemit"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// sameShard returns n new UUIDv7 ids, all on one audit shard.
func sameShard(t *testing.T, n int) []string {
	t.Helper()
	ids := []string{envelope.NewExecutionID()}
	shard := broker.AuditShard(broker.Key(broker.Anonymous, ids[0]))
	for tries := 0; len(ids) < n; tries++ {
		if tries > n*1024*50 {
			t.Fatalf("found %d ids on shard %s", len(ids), shard)
		}
		if id := envelope.NewExecutionID(); broker.AuditShard(broker.Key(broker.Anonymous, id)) == shard {
			ids = append(ids, id)
		}
	}
	return ids
}

// idAt returns a UUIDv7 whose time is at.
func idAt(t *testing.T, at time.Time) string {
	t.Helper()
	u := uuid.Must(uuid.NewV7())
	var ms [8]byte
	binary.BigEndian.PutUint64(ms[:], uint64(at.UnixMilli()))
	copy(u[:6], ms[2:])
	return u.String()
}

// lifecycle is one execution's events as a worker emits them, the middle ones
// in one message.
func lifecycle(e *auditemit.Emitter, id string, step int) {
	switch step {
	case 0:
		e.Emit(event(audit.EventRequested, id))
	case 1:
		e.EmitAll(event(audit.EventStarted, id), event(audit.EventRetried, id), event(audit.EventStarted, id))
	case 2:
		e.Emit(event(audit.EventCompleted, id))
	}
}

// Executions whose ids share a shard share a subject: each trail read or
// followed is its own execution's, whole and in order, however many other
// events the shard holds between its events (more than one direct get's batch).
func TestRead_OneTrailAmongManyExecutionsOnTheSameShard(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	b := provision(t, env.Connect(t), broker.Config{})
	e := newEmitter(t, b, auditemit.Options{})
	ids := sameShard(t, 120)
	for step := 0; step < 3; step++ {
		for _, id := range ids {
			lifecycle(e, id, step)
		}
	}
	flush(t, e)
	info, err := b.Audit.Info(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if info.State.NumSubjects != 1 || info.State.Msgs != 3*120 {
		t.Fatalf("%d subjects, %d messages; want 1 and %d", info.State.NumSubjects, info.State.Msgs, 3*120)
	}
	want := fmt.Sprint([]string{audit.EventRequested, audit.EventStarted, audit.EventRetried, audit.EventStarted, audit.EventCompleted})
	for _, id := range []string{ids[0], ids[57], ids[119]} {
		trail, err := audit.Read(testCtx(t), b.NC, b.Names.Prefix(), broker.Anonymous, id)
		if err != nil {
			t.Fatal(err)
		}
		if got := fmt.Sprint(types(trail)); got != want {
			t.Fatalf("%s: %s, want %s", id, got, want)
		}
		for _, ev := range trail {
			if ev.ExecutionID != id {
				t.Fatalf("%s: the trail holds an event of %s", id, ev.ExecutionID)
			}
		}
		followed := collect(t, b, audit.Filter{ExecutionID: id}, 5, audit.FromStart())
		if got := fmt.Sprint(types(followed)); got != want {
			t.Fatalf("%s followed: %s, want %s", id, got, want)
		}
	}
	if n := auditConsumers(t, b); n != 0 {
		t.Fatalf("%d consumers left on the audit stream", n)
	}
}

// A message without the execution header (written by hand, or by a version
// between) is kept or dropped by the execution id its events carry.
func TestRead_MessagesWithoutTheHeaderAreMatchedByTheirEvents(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	b := provision(t, env.Connect(t), broker.Config{})
	ids := sameShard(t, 2)
	for _, id := range []string{ids[1], ids[0], ids[1]} {
		data, err := envelope.Marshal(event(audit.EventRequested, id))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.JS.Publish(testCtx(t), b.Names.AuditSubject(id), data); err != nil {
			t.Fatal(err)
		}
	}
	trail, err := audit.Read(testCtx(t), b.NC, b.Names.Prefix(), broker.Anonymous, ids[0])
	if err != nil || len(trail) != 1 || trail[0].ExecutionID != ids[0] || trail[0].Seq != 2 {
		t.Fatalf("trail %+v, %v; want the one event at sequence 2", trail, err)
	}
}

// A client whose clock ran ahead made an id later than the events it
// stored: Read finds the trail's first event by reading earlier, up to an
// hour. One whose clock ran behind is read from its id's time, which is
// earlier than every event. Beyond an hour ahead, as everywhere in capstan,
// the clock is too far off: the id is not found.
func TestRead_IDsMadeByAClockAheadOrBehind(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	b := provision(t, env.Connect(t), broker.Config{})
	e := newEmitter(t, b, auditemit.Options{})
	ids := []string{
		idAt(t, time.Now().Add(30*time.Second)), // read from a minute earlier
		idAt(t, time.Now().Add(30*time.Minute)), // read from an hour earlier
		idAt(t, time.Now().Add(-3*time.Hour)),
	}
	tooFar := idAt(t, time.Now().Add(3*time.Hour))
	for step := 0; step < 3; step++ {
		for _, id := range append(ids, tooFar) {
			lifecycle(e, id, step)
		}
	}
	flush(t, e)
	if trail, err := audit.Read(testCtx(t), b.NC, b.Names.Prefix(), broker.Anonymous, tooFar); !errors.Is(err, broker.ErrNotFound) {
		t.Fatalf("an id three hours ahead: %v, %v; want not found", types(trail), err)
	}
	for _, id := range ids {
		trail, err := audit.Read(testCtx(t), b.NC, b.Names.Prefix(), broker.Anonymous, id)
		if err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		if len(trail) != 5 || trail[0].Type != audit.EventRequested || trail[4].Type != audit.EventCompleted {
			t.Fatalf("%s: %v", id, types(trail))
		}
	}
}

// On a stream that does not allow direct gets (created by an earlier
// version, on credentials that could not update it), Read uses message gets.
func TestRead_WithoutDirectGetsUsesMessageGets(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	b := provision(t, env.Connect(t), broker.Config{})
	if !b.Audit.CachedInfo().Config.AllowDirect {
		t.Fatal("the audit stream does not allow direct gets")
	}
	cfg := b.Audit.CachedInfo().Config
	cfg.AllowDirect = false
	if _, err := b.JS.UpdateStream(testCtx(t), cfg); err != nil {
		t.Fatal(err)
	}
	e := newEmitter(t, b, auditemit.Options{})
	ids := sameShard(t, 3)
	for step := 0; step < 3; step++ {
		for _, id := range ids {
			lifecycle(e, id, step)
		}
	}
	flush(t, e)
	trail, err := audit.Read(testCtx(t), b.NC, b.Names.Prefix(), broker.Anonymous, ids[1])
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprint([]string{audit.EventRequested, audit.EventStarted, audit.EventRetried, audit.EventStarted, audit.EventCompleted})
	if got := fmt.Sprint(types(trail)); got != want {
		t.Fatalf("%s, want %s", got, want)
	}
	// Provisioning again turns direct gets on: it only adds a way to read.
	again := provision(t, env.Connect(t), broker.Config{})
	if !again.Audit.CachedInfo().Config.AllowDirect {
		t.Fatal("provisioning left direct gets off")
	}
	if n := auditConsumers(t, b); n != 0 {
		t.Fatalf("%d consumers left on the audit stream", n)
	}
}

// Stores of earlier versions hold audit streams created without direct
// gets; provisioning turns them on and changes nothing else.
func TestProvision_AuditStreamOfAnEarlierVersionGetsDirectGets(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	nc := env.Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	n := broker.NewNames("")
	old := jetstream.StreamConfig{Name: n.AuditStream(), Subjects: []string{n.AuditSubjects()},
		Retention: jetstream.LimitsPolicy, Storage: jetstream.FileStorage, MaxAge: 30 * 24 * time.Hour,
		Discard: jetstream.DiscardOld, DenyDelete: true, DenyPurge: true}
	if _, err := js.CreateStream(testCtx(t), old); err != nil {
		t.Fatal(err)
	}
	b := provision(t, nc, broker.Config{})
	got := b.Audit.CachedInfo().Config
	if !got.AllowDirect || !got.DenyDelete || !got.DenyPurge || got.MaxAge != old.MaxAge {
		t.Fatalf("audit stream after provisioning: %+v", got)
	}
}
