package console

import (
	"testing"
	"time"

	"github.com/capstan-dev/capstan/audit"
)

// A takeover ends the lost worker's attempt as WORKER_LOST and marks the next
// one; the summary counts it, and the outcome closes the last attempt.
func TestTimeline_TakeoverRetryAndOutcomeStandOut(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	ada := audit.Actor{Kind: "user", ID: "ada"}
	trail := []audit.Event{
		{Type: audit.EventRequested, Timestamp: at(0), Actor: ada, ExecutionID: "x", CapabilityID: "orders.refund", Surface: "direct"},
		{Type: audit.EventStarted, Timestamp: at(1), Actor: ada, Worker: "w1", Data: map[string]any{"attempt": int8(1)}},
		{Type: audit.EventTakenOver, Timestamp: at(30001), Actor: ada, Worker: "w2", Data: map[string]any{"fromWorker": "w1", "state": "running"}},
		{Type: audit.EventRetried, Timestamp: at(30002), Actor: ada, Worker: "w2", Data: map[string]any{"attempt": uint8(2), "previousErrorCode": "WORKER_LOST"}},
		{Type: audit.EventStarted, Timestamp: at(30003), Actor: ada, Worker: "w2", Data: map[string]any{"attempt": int64(2)}},
		{Type: audit.EventCompleted, Timestamp: at(30010), Actor: ada, Worker: "w2", Data: map[string]any{"attempts": 2, "durationMs": 30010}},
	}
	steps, atts := timeline(trail)
	var kinds []string
	for _, s := range steps {
		kinds = append(kinds, s.Kind)
	}
	want := []string{"request", "start", "takeover", "retry", "start", "outcome-ok"}
	if len(kinds) != len(want) {
		t.Fatalf("kinds %v, want %v", kinds, want)
	}
	for i := range want {
		if kinds[i] != want[i] {
			t.Fatalf("kinds %v, want %v", kinds, want)
		}
	}
	if steps[2].Title != "taken over by w2" || steps[3].Title != "retry: attempt 2" || steps[5].Offset != 30010*time.Millisecond {
		t.Fatalf("titles %q, %q, offset %v", steps[2].Title, steps[3].Title, steps[5].Offset)
	}
	if len(atts) != 2 ||
		atts[0].Worker != "w1" || atts[0].Outcome != "WORKER_LOST" || atts[0].Takeover ||
		atts[1].Worker != "w2" || atts[1].Outcome != "completed" || !atts[1].Takeover {
		t.Fatalf("attempts %+v", atts)
	}
	var sum execSummary
	for i := range trail {
		sum.apply(&trail[i])
	}
	if sum.Status != "completed" || sum.Attempts != 2 || sum.Takeovers != 1 || sum.Actor != ada {
		t.Fatalf("summary %+v", sum)
	}
}

// A recovered outcome shows how it was recovered: a receipt recorded, then
// the takeover that completed from it; or the reconciler's verdicts, a retry
// it allowed, and the outcome it found.
func TestTimeline_RecoveredOutcomesSayHow(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	ada := audit.Actor{Kind: "user", ID: "ada"}
	for _, c := range []struct {
		name   string
		trail  []audit.Event
		titles []string
	}{
		{"receipt", []audit.Event{
			{Type: audit.EventRequested, Timestamp: at(0), Actor: ada, ExecutionID: "x", CapabilityID: "email.send"},
			{Type: audit.EventStarted, Timestamp: at(1), Actor: ada, Worker: "w1", Data: map[string]any{"attempt": 1}},
			{Type: audit.EventReceiptRecorded, Timestamp: at(5), Actor: ada, Worker: "w1", Data: map[string]any{"attempt": 1, "receiptHash": "ab12"}},
			{Type: audit.EventTakenOver, Timestamp: at(30001), Actor: ada, Worker: "w2", Data: map[string]any{"fromWorker": "w1", "state": "running"}},
			{Type: audit.EventCompleted, Timestamp: at(30002), Actor: ada, Worker: "w2",
				Data: map[string]any{"attempts": 1, "recovered": "receipt", "recoveredAttempt": 1, "receiptHash": "ab12"}},
		}, []string{"requested by user:ada", "attempt 1 started", "receipt recorded by attempt 1", "taken over by w2",
			"completed, recovered from attempt 1's receipt"}},
		{"reconciler", []audit.Event{
			{Type: audit.EventRequested, Timestamp: at(0), Actor: ada, ExecutionID: "x", CapabilityID: "email.send"},
			{Type: audit.EventStarted, Timestamp: at(1), Actor: ada, Worker: "w1", Data: map[string]any{"attempt": 1}},
			{Type: audit.EventTakenOver, Timestamp: at(30001), Actor: ada, Worker: "w2", Data: map[string]any{"fromWorker": "w1", "state": "running"}},
			{Type: audit.EventReconciled, Timestamp: at(30005), Actor: ada, Worker: "w2",
				Data: map[string]any{"attempt": 1, "verdict": "absent", "provesAbsence": true, "durationMs": 4}},
			{Type: audit.EventRetried, Timestamp: at(30006), Actor: ada, Worker: "w2",
				Data: map[string]any{"attempt": 2, "previousErrorCode": "WORKER_LOST", "reason": "reconciled-absent"}},
			{Type: audit.EventStarted, Timestamp: at(30007), Actor: ada, Worker: "w2", Data: map[string]any{"attempt": 2}},
			{Type: audit.EventTakenOver, Timestamp: at(60001), Actor: ada, Worker: "w3", Data: map[string]any{"fromWorker": "w2", "state": "running"}},
			{Type: audit.EventReconciled, Timestamp: at(60005), Actor: ada, Worker: "w3", Data: map[string]any{"attempt": 2, "verdict": "found"}},
			{Type: audit.EventCompleted, Timestamp: at(60006), Actor: ada, Worker: "w3",
				Data: map[string]any{"attempts": 2, "recovered": "reconciler", "recoveredAttempt": 2}},
		}, []string{"requested by user:ada", "attempt 1 started", "taken over by w2", "reconciled attempt 1: absent",
			"retry: attempt 2, the reconciler proved the lost attempt's effect absent", "attempt 2 started", "taken over by w3",
			"reconciled attempt 2: found", "completed, recovered by the reconciler (attempt 2)"}},
	} {
		steps, _ := timeline(c.trail)
		var titles []string
		for _, s := range steps {
			titles = append(titles, s.Title)
		}
		if len(titles) != len(c.titles) {
			t.Fatalf("%s: titles %q, want %q", c.name, titles, c.titles)
		}
		for i := range titles {
			if titles[i] != c.titles[i] {
				t.Errorf("%s: step %d %q, want %q", c.name, i, titles[i], c.titles[i])
			}
		}
		if last := steps[len(steps)-1]; last.Kind != "outcome-ok" {
			t.Errorf("%s: last step %+v, want an outcome-ok", c.name, last)
		}
	}
}

// A call an operator's pause gave back reads queued on its page, as the
// executions list says, until it starts.
func TestSummary_HeldByAPauseIsQueuedUntilItStarts(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	ada := audit.Actor{Kind: "user", ID: "ada"}
	trail := []audit.Event{
		{Type: audit.EventRequested, Timestamp: t0, Actor: ada, ExecutionID: "x", CapabilityID: "email.send"},
		{Type: audit.EventHeld, Timestamp: t0.Add(time.Millisecond), Actor: ada, Data: map[string]any{"mode": "hold"}},
		{Type: audit.EventStarted, Timestamp: t0.Add(time.Minute), Actor: ada, Data: map[string]any{"attempt": 1}},
	}
	var sum execSummary
	for i, want := range []string{"requested", "queued", "running"} {
		sum.apply(&trail[i])
		if sum.Status != want {
			t.Fatalf("after %s: %q, want %q", trail[i].Type, sum.Status, want)
		}
	}
}
