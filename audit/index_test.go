package audit_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/internal/auditemit"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// emitExecution files one execution's trail as a worker does for a quick
// one: one message, which makes one index entry.
func emitExecution(e *auditemit.Emitter, id, principal, capID, actor, end string) {
	mk := func(typ string, data map[string]any) *audit.Event {
		return &audit.Event{Type: typ, ExecutionID: id, CapabilityID: capID, Principal: principal,
			Actor: audit.Actor{ID: actor, Kind: "user"}, Surface: "direct", Data: data}
	}
	evs := []*audit.Event{mk(audit.EventRequested, nil)}
	switch end {
	case "":
		evs = append(evs, mk(audit.EventStarted, map[string]any{"attempt": 1}))
	case audit.EventCompleted:
		evs = append(evs, mk(audit.EventStarted, map[string]any{"attempt": 1}), mk(audit.EventCompleted, map[string]any{"attempts": 1}))
	case audit.EventFailed:
		evs = append(evs, mk(audit.EventFailed, map[string]any{"code": "INPUT_INVALID"}))
	}
	e.EmitAll(evs...)
}

func ids(p *audit.Page) []string {
	out := make([]string, len(p.Entries))
	for i, e := range p.Entries {
		out[i] = e.ExecutionID
	}
	return out
}

func TestList_NewestFirstFilteredAndPaged(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	b := provision(t, env.Connect(t), broker.Config{})
	e := newEmitter(t, b, auditemit.Options{})
	// 300 executions: every 50th fails, of capability orders.refund, for
	// bob under principal gw; the rest complete, demo.echo, alice under app.
	// Each is flushed on its own, as executions further apart than the
	// index's linger are: the index holds them in the order they ended
	// (TestIndex_EndsCloseTogetherAreOneMessage lists ends that share one).
	for i := range 300 {
		id := fmt.Sprintf("exec-%03d", i)
		if i%50 == 7 {
			emitExecution(e, id, "gw", "orders.refund", "bob", audit.EventFailed)
		} else {
			emitExecution(e, id, "app", "demo.echo", "alice", audit.EventCompleted)
		}
		flush(t, e)
	}
	// A long one: its start, then (later) its end.
	emitExecution(e, "exec-long", "app", "demo.sleep", "alice", "")
	flush(t, e)

	page, err := audit.List(testCtx(t), b.NC, b.Names.Prefix(), audit.Query{Limit: 5})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := fmt.Sprint(ids(page)), "[exec-long exec-299 exec-298 exec-297 exec-296]"; got != want {
		t.Fatalf("first page %s, want %s", got, want)
	}
	if page.Entries[0].Status != audit.EntryRunning {
		t.Fatalf("exec-long is %s, want running", page.Entries[0].Status)
	}
	next, err := audit.List(testCtx(t), b.NC, b.Names.Prefix(), audit.Query{Limit: 3, Before: page.Next})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := fmt.Sprint(ids(next)), "[exec-295 exec-294 exec-293]"; got != want {
		t.Fatalf("second page %s, want %s", got, want)
	}

	// Filters the subjects carry, and ones they do not.
	for _, tc := range []struct {
		name string
		q    audit.Query
		want string
	}{
		{"status", audit.Query{Status: audit.EntryFailed}, "[exec-257 exec-207 exec-157 exec-107 exec-057 exec-007]"},
		{"capability", audit.Query{CapabilityID: "orders.refund", Limit: 2}, "[exec-257 exec-207]"},
		{"capability prefix", audit.Query{CapabilityID: "orders.*", Limit: 2}, "[exec-257 exec-207]"},
		{"capability prefix inside a token", audit.Query{CapabilityID: "ord*", Limit: 2}, "[exec-257 exec-207]"},
		{"principal", audit.Query{Principal: "gw", Limit: 1}, "[exec-257]"},
		{"actor id", audit.Query{Actor: "bob", Limit: 1}, "[exec-257]"},
		{"actor kind and id", audit.Query{Actor: "user:bob", Limit: 1}, "[exec-257]"},
		{"another kind", audit.Query{Actor: "agent:bob"}, "[]"},
		{"id prefix", audit.Query{IDPrefix: "exec-00"}, "[exec-009 exec-008 exec-007 exec-006 exec-005 exec-004 exec-003 exec-002 exec-001 exec-000]"},
		{"nothing", audit.Query{CapabilityID: "nobody.calls"}, "[]"},
	} {
		got, err := audit.List(testCtx(t), b.NC, b.Names.Prefix(), tc.q)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if s := fmt.Sprint(ids(got)); s != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, s, tc.want)
		}
	}

	// The long one ends: its newest entry wins, once.
	emitExecution(e, "exec-long", "app", "demo.sleep", "alice", audit.EventCompleted)
	flush(t, e)
	page, err = audit.List(testCtx(t), b.NC, b.Names.Prefix(), audit.Query{Limit: 3})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := fmt.Sprint(ids(page)), "[exec-long exec-299 exec-298]"; got != want || page.Entries[0].Status != audit.EntryCompleted {
		t.Fatalf("after its end: %s (%s), want %s, completed", got, page.Entries[0].Status, want)
	}
	// Time bounds: nothing before the first entry, everything after it.
	if got, err := audit.List(testCtx(t), b.NC, b.Names.Prefix(), audit.Query{Until: time.Now().Add(-time.Hour)}); err != nil || len(got.Entries) != 0 {
		t.Fatalf("until an hour ago: %v %v, want nothing", got, err)
	}
	if got, err := audit.List(testCtx(t), b.NC, b.Names.Prefix(), audit.Query{Since: time.Now().Add(-time.Hour), Limit: 500}); err != nil || len(got.Entries) != 301 || got.Next != 0 {
		t.Fatalf("since an hour ago: %d entries, next %d, %v; want 301 and no next", len(got.Entries), got.Next, err)
	}
}
