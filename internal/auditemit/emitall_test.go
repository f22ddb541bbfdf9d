package auditemit_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/auditemit"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// EmitAll stores several events of one execution as one message; readers get
// them back in the order they were given, between the events emitted before
// and after.
func TestEmitAll_OneMessageKeepsTheEventsOrder(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	b := provision(t, env.Connect(t), broker.Config{})
	e := newEmitter(t, b, auditemit.Options{})
	e.Emit(event(audit.EventRequested, "exec-a"))
	e.EmitAll(event(audit.EventStarted, "exec-a"), event(audit.EventRetried, "exec-a"), event(audit.EventStarted, "exec-a"))
	if err := e.EmitAllSync(testCtx(t), event(audit.EventCompleted, "exec-a"), event(audit.EventDuplicateDelivery, "exec-a")); err != nil {
		t.Fatal(err)
	}
	flush(t, e)
	want := []string{audit.EventRequested, audit.EventStarted, audit.EventRetried, audit.EventStarted, audit.EventCompleted, audit.EventDuplicateDelivery}
	trail, err := audit.Read(testCtx(t), b.NC, b.Names.Prefix(), broker.Anonymous, "exec-a")
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(types(trail)) != fmt.Sprint(want) {
		t.Fatalf("read %v, want %v", types(trail), want)
	}
	// Three messages: the events of one EmitAll share a sequence, each with
	// its place in the message.
	wantSeq := []uint64{1, 2, 2, 2, 3, 3}
	wantIndex := []int{0, 0, 1, 2, 0, 1}
	for i, ev := range trail {
		if ev.Seq != wantSeq[i] || ev.Index != wantIndex[i] {
			t.Fatalf("event %d (%s) at sequence %d index %d, want %d, %d", i, ev.Type, ev.Seq, ev.Index, wantSeq[i], wantIndex[i])
		}
	}
	if e.Sent() != 6 || e.Failed() != 0 {
		t.Fatalf("sent %d, failed %d; want 6 and 0", e.Sent(), e.Failed())
	}
	followed := collect(t, b, audit.Filter{ExecutionID: "exec-a"}, len(want), audit.FromStart())
	if fmt.Sprint(types(followed)) != fmt.Sprint(want) {
		t.Fatalf("followed %v, want %v", types(followed), want)
	}
	// After resumes inside a message exactly after the event given.
	rest := collect(t, b, audit.Filter{ExecutionID: "exec-a"}, 3, audit.After(followed[2]))
	if got := types(rest); fmt.Sprint(got) != fmt.Sprint(want[3:]) {
		t.Fatalf("after event 2: %v, want %v", got, want[3:])
	}
	// A filter on type sees the events inside a message one by one.
	retried := collect(t, b, audit.Filter{Type: audit.EventRetried}, 1, audit.FromStart())
	if retried[0].Seq != 2 || retried[0].Index != 1 {
		t.Fatalf("retried at %d/%d, want 2/1", retried[0].Seq, retried[0].Index)
	}
}

func TestEmitAll_RefusesEventsOfSeveralExecutions(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	b := provision(t, env.Connect(t), broker.Config{})
	e := newEmitter(t, b, auditemit.Options{})
	err := e.EmitAllSync(testCtx(t), event(audit.EventStarted, "exec-a"), event(audit.EventStarted, "exec-b"))
	if !errors.Is(err, audit.ErrUnavailable) || !errors.Is(err, auditemit.ErrMixedExecutions) {
		t.Fatalf("err %v, want ErrUnavailable and ErrMixedExecutions", err)
	}
	e.EmitAll(event(audit.EventStarted, "exec-a"), event(audit.EventStarted, "exec-b"))
	flush(t, e)
	if e.Failed() != 4 || e.Sent() != 0 {
		t.Fatalf("failed %d, sent %d; want 4 and 0", e.Failed(), e.Sent())
	}
	if _, err := audit.Read(testCtx(t), b.NC, b.Names.Prefix(), broker.Anonymous, "exec-a"); !errors.Is(err, broker.ErrNotFound) {
		t.Fatalf("read: %v, want nothing stored", err)
	}
}

// Unacknowledged publishes without asking for JetStream's acknowledgement;
// the events are stored all the same, in order, once Flush returns.
func TestEmit_UnacknowledgedEventsAreStoredInOrder(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	b := provision(t, env.Connect(t), broker.Config{})
	e := newEmitter(t, b, auditemit.Options{Unacknowledged: true})
	const n = 50
	for i := 0; i < n; i++ {
		ev := event(audit.EventRetried, "exec-u")
		ev.Data = map[string]any{"attempt": i}
		if i%2 == 0 {
			e.Emit(ev)
		} else {
			e.EmitAll(ev)
		}
	}
	if err := e.EmitSync(testCtx(t), event(audit.EventCompleted, "exec-u")); err != nil {
		t.Fatal(err)
	}
	flush(t, e)
	// The acknowledged event was stored after every unacknowledged one of
	// the same connection: the trail is whole.
	trail, err := audit.Read(testCtx(t), b.NC, b.Names.Prefix(), broker.Anonymous, "exec-u")
	if err != nil {
		t.Fatal(err)
	}
	if len(trail) != n+1 || trail[n].Type != audit.EventCompleted {
		t.Fatalf("%d events, last %s; want %d ending with %s", len(trail), trail[len(trail)-1].Type, n+1, audit.EventCompleted)
	}
	for i := 0; i < n; i++ {
		if got := asInt(trail[i].Data["attempt"]); got != int64(i) {
			t.Fatalf("event %d is attempt %d", i, got)
		}
	}
	if e.Sent() != n+1 || e.Failed() != 0 {
		t.Fatalf("sent %d, failed %d", e.Sent(), e.Failed())
	}
}

// A closed connection fails an unacknowledged publish on this side: it is
// counted.
func TestEmit_UnacknowledgedFailureOnAClosedConnectionIsCounted(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	nc := env.Connect(t)
	b := provision(t, nc, broker.Config{})
	e := auditemit.New(b.NC, auditemit.Options{Prefix: b.Names.Prefix(), Audit: b.Audit, Index: b.Index, Unacknowledged: true})
	nc.Close()
	e.EmitAll(event(audit.EventStarted, "exec-c"), event(audit.EventCompleted, "exec-c"))
	if e.Failed() != 2 || e.Sent() != 0 {
		t.Fatalf("failed %d, sent %d; want 2 and 0", e.Failed(), e.Sent())
	}
}

// Stores written before the shards keep each execution's events on a subject
// of its own, one event per message, without the execution header: they are
// still read and followed, and a trail that moved to the shard during an
// upgrade reads whole, in stream order.
func TestRead_LegacySingleEventMessagesOnTheExecutionsOwnSubject(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	b := provision(t, env.Connect(t), broker.Config{})
	const id = "0190b6f2-3c4d-7e5f-8a6b-7c8d9e0f1a2b" // a UUIDv7 of 2024
	legacy := func(typ string) {
		t.Helper()
		ev := event(typ, id)
		ev.V = 1
		ev.Timestamp = time.Now().UTC()
		data, err := envelope.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.JS.Publish(testCtx(t), b.Names.LegacyAuditSubject(id), data); err != nil {
			t.Fatal(err)
		}
	}
	legacy(audit.EventRequested)
	legacy(audit.EventStarted)
	if trail, err := audit.Read(testCtx(t), b.NC, b.Names.Prefix(), broker.Anonymous, id); err != nil || fmt.Sprint(types(trail)) != fmt.Sprint([]string{audit.EventRequested, audit.EventStarted}) {
		t.Fatalf("legacy trail %v, %v", types(trail), err)
	}
	e := newEmitter(t, b, auditemit.Options{})
	if err := e.EmitSync(testCtx(t), event(audit.EventCompleted, id)); err != nil {
		t.Fatal(err)
	}
	want := []string{audit.EventRequested, audit.EventStarted, audit.EventCompleted}
	trail, err := audit.Read(testCtx(t), b.NC, b.Names.Prefix(), broker.Anonymous, id)
	if err != nil || fmt.Sprint(types(trail)) != fmt.Sprint(want) {
		t.Fatalf("trail across the upgrade %v, %v; want %v", types(trail), err, want)
	}
	for i, ev := range trail {
		if ev.Seq != uint64(i+1) || ev.Index != 0 || ev.ExecutionID != id || ev.Actor.ID != "alice" {
			t.Fatalf("event %d: %+v", i, ev)
		}
	}
	followed := collect(t, b, audit.Filter{ExecutionID: id}, 3, audit.FromStart())
	if fmt.Sprint(types(followed)) != fmt.Sprint(want) {
		t.Fatalf("followed %v, want %v", types(followed), want)
	}
}

func TestDecode_ReadsBothTheArrayAndTheSingleEventForm(t *testing.T) {
	t.Parallel()
	one, err := envelope.Marshal(event(audit.EventRequested, "x"))
	if err != nil {
		t.Fatal(err)
	}
	many, err := envelope.Marshal([]*audit.Event{event(audit.EventStarted, "x"), event(audit.EventCompleted, "x")})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		data []byte
		want []string
	}{
		{"single", one, []string{audit.EventRequested}},
		{"array", many, []string{audit.EventStarted, audit.EventCompleted}},
	} {
		evs, err := audit.Decode(c.data)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if fmt.Sprint(types(evs)) != fmt.Sprint(c.want) {
			t.Fatalf("%s: %v, want %v", c.name, types(evs), c.want)
		}
		for i, ev := range evs {
			if ev.Index != i || ev.ExecutionID != "x" {
				t.Fatalf("%s: event %d: %+v", c.name, i, ev)
			}
		}
	}
	for _, bad := range [][]byte{{0x90}, {0xc1}, {0x92, 0x80}, {0x91, 0x01}, nil} {
		if evs, err := audit.Decode(bad); err == nil {
			t.Fatalf("% x decoded to %v", bad, evs)
		}
	}
}
