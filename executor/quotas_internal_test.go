package executor

import (
	"fmt"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
)

// Read-only events of a principal: the first of an interval is filed at
// once, the rest of it make one event when it ends, naming how many and
// who (a bounded list); another principal's are its own; an interval
// without more than its first files nothing at its end.
func TestReadOnlyEvents_OneAtOnceOneForTheRest(t *testing.T) {
	t.Parallel()
	var c readOnlyEvents
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ev := func(principal, actor string) *audit.Event {
		return &audit.Event{Type: audit.EventDiscovered, Principal: principal, Actor: audit.ActorOf(envelope.Actor{Kind: "user", ID: actor}),
			Data: map[string]any{"digest": "d1", "withheld": []map[string]any{{"capabilityId": "orders.refund", "reason": "policy-hidden"}}}}
	}
	if !c.file(ev("alice", "a0"), t0) || !c.file(ev("bob", "b0"), t0) {
		t.Fatal("a principal's first event of an interval was held back")
	}
	// Alice's first descriptions of fifteen more actors are filed at once
	// (sixteen distinct in all); her repeats, and the other actors', are
	// counted.
	filed := 0
	for i := range 1000 {
		if c.file(ev("alice", fmt.Sprint("a", i%40)), t0.Add(time.Duration(i)*time.Microsecond)) {
			filed++
		}
	}
	if filed != coalesceDistinct-1 {
		t.Fatalf("alice's events filed at once: %d, want %d more distinct ones", filed, coalesceDistinct-1)
	}
	if due := c.due(t0.Add(coalesceEvery / 2)); len(due) != 0 {
		t.Fatalf("%d summaries before the interval ended", len(due))
	}
	due := c.due(t0.Add(coalesceEvery))
	if len(due) != 1 || due[0].Principal != "alice" {
		t.Fatalf("at the interval's end: %+v, want alice's summary alone (bob had only his first)", due)
	}
	d := due[0].Data
	if d["coalesced"] != 1000-filed || len(d["actors"].([]string)) != coalesceKept || !(d["unlisted"].(int) > 0 && d["unlisted"].(int) < 1000-filed) ||
		fmt.Sprint(d["digests"]) != "[d1]" || fmt.Sprint(d["withheld"]) != "map[orders.refund:policy-hidden]" {
		t.Fatalf("the summary: %+v", d)
	}
	if envelope.ValidExecutionID(due[0].ExecutionID) != nil || due[0].Type != audit.EventDiscovered {
		t.Fatalf("the summary's identity: %+v", due[0])
	}
	// The next interval begins with its first event at once again.
	if !c.file(ev("alice", "a0"), t0.Add(2*coalesceEvery)) {
		t.Fatal("alice's first event of the next interval was held back")
	}
	if c.file(ev("alice", "a0"), t0.Add(2*coalesceEvery)) {
		t.Fatal("alice's repeat in the next interval was filed at once")
	}
	// A worker that stops files every summary it holds.
	if all := c.due(time.Time{}); len(all) != 1 || all[0].Data["coalesced"] != 1 {
		t.Fatalf("at the stop: %+v", all)
	}
}
