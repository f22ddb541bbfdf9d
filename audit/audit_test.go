package audit_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/internal/auditemit"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
)

func TestMain(m *testing.M) {
	testenv.RaiseParallel()
	goleak.VerifyTestMain(m)
}

// testCtx bounds each test's JetStream calls so a broken server fails the test
// instead of hanging it; it is a safety net, not a timing assertion.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func provision(t *testing.T, nc *nats.Conn, cfg broker.Config) *broker.Broker {
	t.Helper()
	b, err := broker.Provision(testCtx(t), nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func newEmitter(t *testing.T, b *broker.Broker, opts auditemit.Options) *auditemit.Emitter {
	t.Helper()
	opts.Prefix, opts.Audit, opts.Index = b.Names.Prefix(), b.Audit, b.Index
	e := auditemit.New(b.NC, opts)
	t.Cleanup(func() { _ = e.Flush(context.Background()) })
	return e
}

func event(typ, executionID string) *audit.Event {
	return &audit.Event{Type: typ, ExecutionID: executionID, CapabilityID: "demo.echo",
		Actor: audit.Actor{ID: "alice", Kind: "user"}, Surface: "direct", Worker: "w1"}
}

func flush(t *testing.T, e *auditemit.Emitter) {
	t.Helper()
	if err := e.Flush(testCtx(t)); err != nil {
		t.Fatal(err)
	}
}

func types(trail []audit.Event) []string {
	out := make([]string, len(trail))
	for i, ev := range trail {
		out[i] = ev.Type
	}
	return out
}

func TestRead_OneExecutionsTrailOldestFirst(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	b := provision(t, env.Connect(t), broker.Config{})
	e := newEmitter(t, b, auditemit.Options{})
	// Two executions interleaved on the stream: each trail holds only its own.
	for _, typ := range []string{audit.EventRequested, audit.EventStarted, audit.EventCompleted} {
		e.Emit(event(typ, "exec-a"))
		e.Emit(event(typ, "exec-b"))
	}
	flush(t, e)

	for _, id := range []string{"exec-a", "exec-b"} {
		trail, err := audit.Read(testCtx(t), b.NC, b.Names.Prefix(), broker.Anonymous, id)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := fmt.Sprint(types(trail)), fmt.Sprint([]string{audit.EventRequested, audit.EventStarted, audit.EventCompleted}); got != want {
			t.Fatalf("%s: trail %s, want %s", id, got, want)
		}
		for i, ev := range trail {
			if ev.ExecutionID != id || ev.Actor.ID != "alice" || ev.Worker != "w1" || ev.V != 1 || ev.Timestamp.IsZero() {
				t.Fatalf("%s: event %d is %+v", id, i, ev)
			}
			if i > 0 && ev.Seq <= trail[i-1].Seq {
				t.Fatalf("%s: sequences %d then %d", id, trail[i-1].Seq, ev.Seq)
			}
		}
	}
}

func TestRead_UnknownExecutionIsNotFound(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	b := provision(t, env.Connect(t), broker.Config{})
	if _, err := audit.Read(testCtx(t), b.NC, b.Names.Prefix(), broker.Anonymous, "never-ran"); !errors.Is(err, audit.ErrNoEvents) || !errors.Is(err, broker.ErrNotFound) {
		t.Fatalf("err %v, want audit.ErrNoEvents", err)
	}
}

func TestRead_RefusesIDsThatAreNotOneSubjectToken(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	b := provision(t, env.Connect(t), broker.Config{})
	e := newEmitter(t, b, auditemit.Options{})
	e.Emit(event(audit.EventRequested, "x"))
	flush(t, e)
	for _, id := range []string{"*", ">", "x.>", "", "a b"} {
		if trail, err := audit.Read(testCtx(t), b.NC, b.Names.Prefix(), broker.Anonymous, id); err == nil || errors.Is(err, broker.ErrNotFound) {
			t.Fatalf("id %q: trail %v, err %v; want a refusal", id, trail, err)
		}
	}
}

// auditConsumers counts the consumers left on the audit stream.
func auditConsumers(t *testing.T, b *broker.Broker) int {
	t.Helper()
	info, err := b.Audit.Info(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Consumers
}

// collect follows until n events passed the filter.
func collect(t *testing.T, b *broker.Broker, f audit.Filter, n int, opts ...audit.FollowOption) []audit.Event {
	t.Helper()
	var got []audit.Event
	stop := errors.New("enough")
	err := audit.Follow(testCtx(t), b.NC, b.Names.Prefix(), f, func(ev audit.Event) error {
		got = append(got, ev)
		if len(got) == n {
			return stop
		}
		return nil
	}, opts...)
	if !errors.Is(err, stop) {
		t.Fatalf("follow: %v", err)
	}
	return got
}

func TestFollow_FiltersOnExecutionCapabilityActorAndType(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	b := provision(t, env.Connect(t), broker.Config{})
	e := newEmitter(t, b, auditemit.Options{})
	for i := 0; i < 3; i++ {
		for _, typ := range []string{audit.EventRequested, audit.EventStarted, audit.EventCompleted} {
			ev := event(typ, fmt.Sprintf("exec-%d", i))
			if i == 1 {
				ev.CapabilityID = "orders.refund"
			}
			if i == 2 {
				ev.Actor.ID = "bob"
			}
			e.Emit(ev)
		}
	}
	e.Emit(event(audit.EventFailed, "exec-last")) // the end marker every filter below passes
	flush(t, e)

	cases := []struct {
		name string
		f    audit.Filter
		want []string // execution id / type
	}{
		{"execution", audit.Filter{ExecutionID: "exec-1"},
			[]string{"exec-1/" + audit.EventRequested, "exec-1/" + audit.EventStarted, "exec-1/" + audit.EventCompleted}},
		{"capability", audit.Filter{CapabilityID: "orders.refund"},
			[]string{"exec-1/" + audit.EventRequested, "exec-1/" + audit.EventStarted, "exec-1/" + audit.EventCompleted}},
		{"actor", audit.Filter{ActorID: "bob"},
			[]string{"exec-2/" + audit.EventRequested, "exec-2/" + audit.EventStarted, "exec-2/" + audit.EventCompleted}},
		{"type", audit.Filter{Type: audit.EventStarted},
			[]string{"exec-0/" + audit.EventStarted, "exec-1/" + audit.EventStarted, "exec-2/" + audit.EventStarted}},
		{"type and actor", audit.Filter{Type: audit.EventCompleted, ActorID: "alice"},
			[]string{"exec-0/" + audit.EventCompleted, "exec-1/" + audit.EventCompleted}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := collect(t, b, c.f, len(c.want), audit.FromStart())
			var s []string
			for _, ev := range got {
				s = append(s, ev.ExecutionID+"/"+ev.Type)
			}
			if fmt.Sprint(s) != fmt.Sprint(c.want) {
				t.Fatalf("got %v, want %v", s, c.want)
			}
		})
	}
	if n := auditConsumers(t, b); n != 0 {
		t.Fatalf("%d consumers left on the audit stream", n)
	}
}

func TestFollow_StartsWithNewEventsByDefault(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	b := provision(t, env.Connect(t), broker.Config{})
	e := newEmitter(t, b, auditemit.Options{})
	e.Emit(event(audit.EventRequested, "old"))
	flush(t, e)

	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	got := make(chan audit.Event, 10)
	done := make(chan error, 1)
	go func() {
		done <- audit.Follow(ctx, b.NC, b.Names.Prefix(), audit.Filter{}, func(ev audit.Event) error { got <- ev; return nil })
	}()
	// The follower has started once its consumer exists.
	for auditConsumers(t, b) == 0 {
		select {
		case <-ctx.Done():
			t.Fatal("the follower never created its consumer")
		case <-time.After(10 * time.Millisecond):
		}
	}
	e.Emit(event(audit.EventRequested, "new"))
	flush(t, e)
	if ev := <-got; ev.ExecutionID != "new" {
		t.Fatalf("first followed event is of %s, want the new one", ev.ExecutionID)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("follow ended with %v, want nil when its context ends", err)
	}
	if n := auditConsumers(t, b); n != 0 {
		t.Fatalf("%d consumers left on the audit stream", n)
	}
}

func TestFollow_ResumesFromASequenceOrATime(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	b := provision(t, env.Connect(t), broker.Config{})
	e := newEmitter(t, b, auditemit.Options{})
	for i := 0; i < 5; i++ {
		e.Emit(event(audit.EventRequested, fmt.Sprintf("exec-%d", i)))
	}
	flush(t, e)
	all := collect(t, b, audit.Filter{}, 5, audit.FromStart())

	fromSeq := collect(t, b, audit.Filter{}, 2, audit.FromSeq(all[3].Seq))
	if fromSeq[0].ExecutionID != "exec-3" || fromSeq[1].ExecutionID != "exec-4" {
		t.Fatalf("from sequence %d: %s, %s", all[3].Seq, fromSeq[0].ExecutionID, fromSeq[1].ExecutionID)
	}
	// Since is by the time the stream stored the event; the event's own
	// timestamp, set before publishing, is no later than it.
	since := collect(t, b, audit.Filter{}, 1, audit.Since(all[0].Timestamp))
	if since[0].ExecutionID != "exec-0" {
		t.Fatalf("since the first event's time: %s", since[0].ExecutionID)
	}
}

func TestFollow_UndecodableEventIsAnErrorNamingItsSequence(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	nc := env.Connect(t)
	b := provision(t, nc, broker.Config{})
	if _, err := b.JS.Publish(testCtx(t), b.Names.AuditSubject("garbage"), []byte{0xc1}); err != nil {
		t.Fatal(err)
	}
	err := audit.Follow(testCtx(t), b.NC, b.Names.Prefix(), audit.Filter{}, func(audit.Event) error { return nil }, audit.FromStart())
	if err == nil || !strings.Contains(err.Error(), "sequence 1") {
		t.Fatalf("err %v, want a decode error naming sequence 1", err)
	}
	if _, err := audit.Read(testCtx(t), b.NC, b.Names.Prefix(), broker.Anonymous, "garbage"); err == nil || !strings.Contains(err.Error(), "sequence 1") {
		t.Fatalf("read: err %v, want a decode error naming sequence 1", err)
	}
}

func TestProvision_AuditRetentionDefaultsTo30DaysAndIsKeptOnceSet(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	nc := env.Connect(t)
	for _, c := range []struct {
		prefix string
		maxAge time.Duration
		want   time.Duration
	}{
		{"DEFAULTS", 0, 30 * 24 * time.Hour},
		{"WEEK", 7 * 24 * time.Hour, 7 * 24 * time.Hour},
	} {
		b := provision(t, nc, broker.Config{Prefix: c.prefix, AuditMaxAge: c.maxAge})
		info, err := b.Audit.Info(testCtx(t))
		if err != nil {
			t.Fatal(err)
		}
		if info.Config.MaxAge != c.want {
			t.Fatalf("%s: audit stream MaxAge %v, want %v", c.prefix, info.Config.MaxAge, c.want)
		}
	}
	// A process that does not say keeps the retention the stream was given.
	b := provision(t, nc, broker.Config{Prefix: "WEEK"})
	if b.Config.AuditMaxAge != 7*24*time.Hour {
		t.Fatalf("unset retention over a 7-day stream: %v", b.Config.AuditMaxAge)
	}
	// A process that asks for another retention than the stream has is told,
	// never silently given the other one.
	_, err := broker.Provision(testCtx(t), nc, broker.Config{Prefix: "WEEK", AuditMaxAge: 24 * time.Hour})
	if !errors.Is(err, broker.ErrConfigConflict) {
		t.Fatalf("err %v, want broker.ErrConfigConflict", err)
	}
}
