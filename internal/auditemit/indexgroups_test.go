package auditemit_test

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/auditemit"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// indexMsgs is how many messages the index stream holds.
func indexMsgs(t *testing.T, b *broker.Broker) uint64 {
	t.Helper()
	info, err := b.Index.Info(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

// listAll pages through a listing with limit entries a page and returns
// the ids in the order the pages gave them, and the cursors they gave.
func listAll(t *testing.T, b *broker.Broker, q audit.Query) (ids, cursors []string) {
	t.Helper()
	for {
		page, err := audit.List(testCtx(t), b.NC, b.Names.Prefix(), q)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range page.Entries {
			ids = append(ids, e.ExecutionID)
		}
		c := page.Cursor()
		if c == "" {
			return ids, cursors
		}
		cursors = append(cursors, c)
		if err := q.SetCursor(c); err != nil {
			t.Fatal(err)
		}
	}
}

// Executions that end close together on one subject are one message of the
// index, not one each (the write path's server message per execution):
// a listing still gives each of them once, newest first within the
// message, through pages that end inside it. A running entry waits too, and
// the execution's end, when it comes first, replaces it.
func TestIndex_EndsCloseTogetherAreOneMessage(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	b := provision(t, env.Connect(t), broker.Config{})
	e := newEmitter(t, b, auditemit.Options{})
	auditemit.SetIndexLinger(e, time.Hour) // only flushes send: the messages are counted

	emitExecution(e, "exec-long", "app", "demo.sleep", "alice", "") // running
	for i := range 40 {
		emitExecution(e, fmt.Sprintf("exec-%03d", i), "app", "demo.echo", "alice", audit.EventCompleted)
	}
	for i := range 3 {
		emitExecution(e, fmt.Sprintf("fail-%d", i), "gw", "orders.refund", "bob", audit.EventFailed)
	}
	flush(t, e)
	if got := indexMsgs(t, b); got != 3 {
		t.Fatalf("the index holds %d messages, want 3: the 40 completed, the 3 failed, the running one", got)
	}

	want := []string{"exec-long", "fail-2", "fail-1", "fail-0"}
	for i := 39; i >= 0; i-- {
		want = append(want, fmt.Sprintf("exec-%03d", i))
	}
	got, cursors := listAll(t, b, audit.Query{Limit: 7})
	if !slices.Equal(got, want) {
		t.Fatalf("pages of 7 gave %v, want %v", got, want)
	}
	if !slices.ContainsFunc(cursors, func(c string) bool { return strings.Contains(c, ".") }) {
		t.Fatalf("cursors %v: none inside a message", cursors)
	}
	got, _ = listAll(t, b, audit.Query{CapabilityID: "demo.echo", Limit: 15})
	if !slices.Equal(got, want[4:]) {
		t.Fatalf("demo.echo in pages of 15 gave %v, want %v", got, want[4:])
	}

	// A quick one's running entry, then its end before anything went: only
	// the end is written.
	emitExecution(e, "exec-quick", "app", "demo.sleep", "alice", "")
	emitExecution(e, "exec-quick", "app", "demo.sleep", "alice", audit.EventCompleted)
	flush(t, e)
	if got := indexMsgs(t, b); got != 4 {
		t.Fatalf("the index holds %d messages, want 4: the end alone", got)
	}
	got, _ = listAll(t, b, audit.Query{Status: audit.EntryRunning})
	if !slices.Equal(got, []string{"exec-long"}) {
		t.Fatalf("running: %v, want exec-long alone", got)
	}

	// Without a flush, an end goes once the linger has passed.
	e2 := newEmitter(t, b, auditemit.Options{})
	auditemit.SetIndexLinger(e2, 10*time.Millisecond)
	emitExecution(e2, "exec-long", "app", "demo.sleep", "alice", audit.EventCompleted)
	for ctx := testCtx(t); indexMsgs(t, b) < 5; {
		select {
		case <-ctx.Done():
			t.Fatal("the end was not published without a flush")
		case <-time.After(10 * time.Millisecond):
		}
	}
	page, err := audit.List(testCtx(t), b.NC, b.Names.Prefix(), audit.Query{Limit: 2})
	if err != nil {
		t.Fatal(err)
	}
	if page.Entries[0].ExecutionID != "exec-long" || page.Entries[0].Status != audit.EntryCompleted {
		t.Fatalf("after its end the newest is %+v, want exec-long completed", page.Entries[0])
	}
	if n := e.IndexFailed() + e2.IndexFailed(); n != 0 {
		t.Fatalf("%d entries failed", n)
	}
}

// A message of the index written before ends were coalesced holds one
// entry, as the reflective encoder wrote it: the entry's own encoder writes
// the same bytes, and a listing reads both kinds of message.
func TestIndex_OneEntryMessagesAsBefore(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 1, 10, 0, 0, 123456789, time.UTC)
	full := audit.Entry{V: 1, ExecutionID: "x-1", Principal: "app", CapabilityID: "demo.echo",
		Actor: audit.Actor{ID: "alice", Kind: "user"}, Surface: "mcp", Status: audit.EntryFailed, Code: "TIMEOUT",
		Attempts: 3, DurationMs: 1500, ApprovalID: "ap-1", Resumed: true, RequestedAt: at, UpdatedAt: at.Add(time.Second)}
	// plainEntry has Entry's fields without its encoder: the reflective
	// encoder writes it, as entries were written before they were grouped.
	type plainEntry audit.Entry
	env := testenv.Start(t)
	b := provision(t, env.Connect(t), broker.Config{})
	old, err := envelope.Marshal(plainEntry(full))
	if err != nil {
		t.Fatal(err)
	}
	js := b.JS
	if _, err := js.Publish(testCtx(t), b.Names.IndexSubject("app", audit.EntryFailed, "alice", "demo.echo"), old); err != nil {
		t.Fatal(err)
	}
	e := newEmitter(t, b, auditemit.Options{})
	for i := range 3 {
		emitExecution(e, fmt.Sprintf("new-%d", i), "app", "demo.echo", "alice", audit.EventCompleted)
	}
	flush(t, e)
	got, _ := listAll(t, b, audit.Query{Limit: 2})
	if want := []string{"new-2", "new-1", "new-0", "x-1"}; !slices.Equal(got, want) {
		t.Fatalf("listed %v, want %v", got, want)
	}
}

func TestIndex_CursorsRoundTripAndBadOnesAreRefused(t *testing.T) {
	t.Parallel()
	for _, p := range []audit.Page{{Next: 17}, {Next: 17, NextEntry: 3}, {}} {
		c := p.Cursor()
		if p.Next == 0 {
			if c != "" {
				t.Fatalf("no next: cursor %q, want none", c)
			}
			continue
		}
		var q audit.Query
		if err := q.SetCursor(c); err != nil || q.Before != p.Next || q.BeforeEntry != p.NextEntry {
			t.Fatalf("cursor %q read back as %d.%d (%v), want %d.%d", c, q.Before, q.BeforeEntry, err, p.Next, p.NextEntry)
		}
	}
	for _, c := range []string{"x", "17.", "17.x", "17.-1", "17.0", "-3", "1.2.3"} {
		var q audit.Query
		if err := q.SetCursor(c); err == nil {
			t.Fatalf("cursor %q taken as %d.%d", c, q.Before, q.BeforeEntry)
		}
	}
}

// emitApprovalRequested emits the message of an execution that asks for an
// approval: its entry goes at once.
func emitApprovalRequested(e *auditemit.Emitter, id string) {
	e.EmitAll(&audit.Event{Type: audit.EventApprovalRequested, ExecutionID: id, CapabilityID: "orders.refund", Principal: "app",
		Actor: audit.Actor{ID: "alice", Kind: "user"}, Surface: "direct", Data: map[string]any{"approvalId": "ap-" + id}})
}

// An approval-required entry goes at once, after the entries that waited
// (a listing shows what changed before it after it), yet a listing shows
// its execution as waiting for its approval, never as running: the running
// entry that waited is replaced, and one a flush was sending is stored
// first.
func TestIndex_ApprovalRequiredComesAfterTheRunningEntry(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	b := provision(t, env.Connect(t), broker.Config{})

	e := newEmitter(t, b, auditemit.Options{})
	auditemit.SetIndexLinger(e, time.Hour)
	emitExecution(e, "exec-before", "app", "demo.echo", "alice", audit.EventCompleted) // waits
	emitExecution(e, "exec-held", "app", "orders.refund", "alice", "")                 // running, waits
	emitApprovalRequested(e, "exec-held")
	flush(t, e) // waits for the acknowledgements: nothing waits any more
	if got := indexMsgs(t, b); got != 2 {
		t.Fatalf("the index holds %d messages, want 2: the end that waited, then the approval-required entry, which replaced the running one", got)
	}
	page, err := audit.List(testCtx(t), b.NC, b.Names.Prefix(), audit.Query{})
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(page); !slices.Equal(got, []string{"exec-held", "exec-before"}) || page.Entries[0].Status != audit.EntryApprovalRequired ||
		page.Entries[0].ApprovalID != "ap-exec-held" {
		t.Fatalf("listed %+v, want exec-held approval-required, then exec-before", page.Entries)
	}

	// A flush takes the running entry and is slow to send it: the
	// approval-required entry waits for it, and is stored after.
	e2 := newEmitter(t, b, auditemit.Options{})
	auditemit.SetIndexLinger(e2, time.Hour)
	var mu sync.Mutex
	var order []string
	taken, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	defer once.Do(func() { close(release) }) // a failure leaves nothing waiting
	auditemit.WrapIndexSend(e2, func(subject string, send func()) {
		if strings.Contains(subject, ".running.") {
			close(taken)
			<-release
		}
		mu.Lock()
		order = append(order, subject)
		mu.Unlock()
		send()
	})
	emitExecution(e2, "exec-slow", "app", "orders.refund", "alice", "")
	flushed := make(chan error, 1)
	go func() { flushed <- e2.Flush(testCtx(t)) }()
	<-taken
	approved := make(chan struct{})
	go func() { emitApprovalRequested(e2, "exec-slow"); close(approved) }()
	select {
	case <-approved:
		t.Fatal("the approval-required entry went while the running entry a flush took was not sent")
	case <-time.After(50 * time.Millisecond):
	}
	once.Do(func() { close(release) })
	<-approved
	if err := <-flushed; err != nil {
		t.Fatal(err)
	}
	flush(t, e2)
	if len(order) != 2 || !strings.Contains(order[0], ".running.") || !strings.Contains(order[1], ".approval-required.") {
		t.Fatalf("sent %v, want the running entry, then the approval-required one", order)
	}
	page, err = audit.List(testCtx(t), b.NC, b.Names.Prefix(), audit.Query{IDPrefix: "exec-slow"})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Entries) != 1 || page.Entries[0].Status != audit.EntryApprovalRequired {
		t.Fatalf("listed %+v, want exec-slow approval-required", page.Entries)
	}
	if n := e.IndexFailed() + e2.IndexFailed(); n != 0 {
		t.Fatalf("%d entries failed", n)
	}
}

// A pause's hold (a queued entry) goes at once, though an end of another
// execution waits in its group: the execution's own end, which comes after
// it, is stored after it, so that a listing shows the end, never a queued
// call that has ended (the execution given back, any worker may end it at
// its next delivery).
func TestIndex_QueuedGoesAtOnce_ItsEndIsStoredAfter(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	b := provision(t, env.Connect(t), broker.Config{})
	e := newEmitter(t, b, auditemit.Options{})
	auditemit.SetIndexLinger(e, time.Hour)
	emitExecution(e, "exec-other", "app", "email.send", "alice", audit.EventFailed) // an end that waits in its group
	emitExecution(e, "exec-held", "app", "email.send", "alice", "")                 // running, waits
	emitHeld(e, "exec-held", "app")
	e.EmitAll(&audit.Event{Type: audit.EventFailed, ExecutionID: "exec-held", CapabilityID: "email.send", Principal: "app",
		Actor: audit.Actor{ID: "alice", Kind: "user"}, Surface: "direct", Data: map[string]any{"code": "NOT_STARTED"}})
	flush(t, e)
	page, err := audit.List(testCtx(t), b.NC, b.Names.Prefix(), audit.Query{IDPrefix: "exec-held"})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Entries) != 1 || page.Entries[0].Status != audit.EntryFailed {
		t.Fatalf("listed %+v, want exec-held failed", page.Entries)
	}
	queued, err := audit.List(testCtx(t), b.NC, b.Names.Prefix(), audit.Query{Status: audit.EntryQueued})
	if err != nil {
		t.Fatal(err)
	}
	if len(queued.Entries) != 1 || queued.Entries[0].ExecutionID != "exec-held" {
		t.Fatalf("queued entries %+v, want exec-held's hold, stored", queued.Entries)
	}
}

// A pause's hold goes at once, and alone: the ends of other executions
// waiting in their groups keep waiting, so that a pause of one principal's
// calls does not break up everyone's grouping.
func TestIndex_QueuedLeavesTheOthersGroupsWaiting(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	b := provision(t, env.Connect(t), broker.Config{})
	e := newEmitter(t, b, auditemit.Options{})
	auditemit.SetIndexLinger(e, time.Hour)
	for i := range 10 {
		emitExecution(e, fmt.Sprintf("exec-bob-%d", i), "bob", "demo.echo", "bob", audit.EventCompleted)
		emitHeld(e, fmt.Sprintf("exec-alice-%d", i), "alice")
	}
	list := func(principal string) []audit.Entry {
		page, err := audit.List(testCtx(t), b.NC, b.Names.Prefix(), audit.Query{Principal: principal})
		if err != nil {
			t.Fatal(err)
		}
		return page.Entries
	}
	// One connection keeps its order: once the last hold is stored, so is
	// whatever was sent before it.
	for ctx := testCtx(t); len(list("alice")) < 10; time.Sleep(10 * time.Millisecond) {
		if ctx.Err() != nil {
			t.Fatal("the holds were not stored at once")
		}
	}
	if got := list("bob"); len(got) != 0 {
		t.Fatalf("%d of bob's ends were sent with alice's holds, want them all waiting for their group", len(got))
	}
	before := indexMsgs(t, b)
	flush(t, e)
	if got := indexMsgs(t, b); before != 10 || got != 11 || len(list("bob")) != 10 {
		t.Fatalf("the index held %d messages, then %d after the flush; want the 10 holds, then one group of bob's 10 ends", before, got)
	}
}

// emitHeld emits the hold of principal's execution id of email.send by an
// operator's pause.
func emitHeld(e *auditemit.Emitter, id, principal string) {
	e.EmitAll(&audit.Event{Type: audit.EventHeld, ExecutionID: id, CapabilityID: "email.send", Principal: principal,
		Actor: audit.Actor{ID: "alice", Kind: "user"}, Surface: "direct", Data: map[string]any{"mode": "hold"}})
}
