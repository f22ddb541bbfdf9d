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
		{Type: audit.Requested, Timestamp: at(0), Actor: ada, ExecutionID: "x", CapabilityID: "orders.refund", Surface: "direct"},
		{Type: audit.Started, Timestamp: at(1), Actor: ada, Worker: "w1", Data: map[string]any{"attempt": int8(1)}},
		{Type: audit.TakenOver, Timestamp: at(30001), Actor: ada, Worker: "w2", Data: map[string]any{"fromWorker": "w1", "state": "running"}},
		{Type: audit.Retried, Timestamp: at(30002), Actor: ada, Worker: "w2", Data: map[string]any{"attempt": uint8(2), "previousErrorCode": "WORKER_LOST"}},
		{Type: audit.Started, Timestamp: at(30003), Actor: ada, Worker: "w2", Data: map[string]any{"attempt": int64(2)}},
		{Type: audit.Completed, Timestamp: at(30010), Actor: ada, Worker: "w2", Data: map[string]any{"attempts": 2, "durationMs": 30010}},
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
