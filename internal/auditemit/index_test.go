package auditemit_test

import (
	"testing"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/internal/auditemit"
)

func TestEntryOf_BeginningsAndEndsOnly(t *testing.T) {
	t.Parallel()
	ev := func(typ string, data map[string]any) *audit.Event {
		e := event(typ, "exec-1")
		e.Principal, e.Data = "alice", data
		return e
	}
	for _, tc := range []struct {
		name       string
		evs        []*audit.Event
		wantStatus string // "" : no entry
		wantCode   string
		attempts   int
		approval   string
		resumed    bool
	}{
		{"a quick execution: one message, its end", []*audit.Event{ev(audit.EventRequested, nil), ev(audit.EventStarted, map[string]any{"attempt": 1}),
			ev(audit.EventCompleted, map[string]any{"attempts": 1, "durationMs": 3})}, audit.EntryCompleted, "", 1, "", false},
		{"a long one's first message: running", []*audit.Event{ev(audit.EventRequested, nil), ev(audit.EventStarted, map[string]any{"attempt": 1})},
			audit.EntryRunning, "", 1, "", false},
		{"its end alone", []*audit.Event{ev(audit.EventFailed, map[string]any{"code": "TIMEOUT", "attempts": int64(2)})},
			audit.EntryFailed, "TIMEOUT", 2, "", false},
		{"a takeover's start alone: running", []*audit.Event{ev(audit.EventTakenOver, nil), ev(audit.EventStarted, map[string]any{"attempt": 2})},
			audit.EntryRunning, "", 2, "", false},
		{"held by a pause: queued", []*audit.Event{ev(audit.EventRequested, nil), ev(audit.EventHeld, map[string]any{"mode": "hold"})},
			audit.EntryQueued, "", 0, "", false},
		{"its hold alone: queued", []*audit.Event{ev(audit.EventHeld, map[string]any{"mode": "hold"})}, audit.EntryQueued, "", 0, "", false},
		{"waiting at a limit: queued", []*audit.Event{ev(audit.EventRequested, nil), ev(audit.EventLimited, map[string]any{"action": "wait"})},
			audit.EntryQueued, "", 0, "", false},
		{"its wait filed again alone: queued", []*audit.Event{ev(audit.EventLimited, map[string]any{"action": "wait"})}, audit.EntryQueued, "", 0, "", false},
		{"refused at a limit: failed", []*audit.Event{ev(audit.EventRequested, nil), ev(audit.EventLimited, map[string]any{"action": "refuse"}),
			ev(audit.EventFailed, map[string]any{"code": "RATE_LIMITED"})}, audit.EntryFailed, "RATE_LIMITED", 0, "", false},
		{"its start once unpaused: running", []*audit.Event{ev(audit.EventStarted, map[string]any{"attempt": 1})},
			audit.EntryRunning, "", 1, "", false},
		{"a retry alone: no entry", []*audit.Event{ev(audit.EventRetried, map[string]any{"attempt": 2})}, "", "", 0, "", false},
		{"a duplicate delivery: no entry", []*audit.Event{ev(audit.EventDuplicateDelivery, nil)}, "", "", 0, "", false},
		{"an approval decision: no entry", []*audit.Event{ev(audit.EventApproved, nil)}, "", "", 0, "", false},
		{"approval required", []*audit.Event{ev(audit.EventRequested, nil), ev(audit.EventApprovalRequested, map[string]any{"approvalId": "ap-1"})},
			audit.EntryApprovalRequired, "", 0, "ap-1", false},
		{"a resume", []*audit.Event{ev(audit.EventRequested, nil), ev(audit.EventApprovalConsumed, map[string]any{"approvalId": "ap-1"}),
			ev(audit.EventStarted, map[string]any{"attempt": 1, "approvalId": "ap-1"}), ev(audit.EventCompleted, map[string]any{"attempts": 1})},
			audit.EntryCompleted, "", 1, "ap-1", true},
		{"cancelled", []*audit.Event{ev(audit.EventCancelled, map[string]any{"code": "CANCELLED"})}, audit.EntryCancelled, "CANCELLED", 0, "", false},
		{"denied then failed", []*audit.Event{ev(audit.EventRequested, nil), ev(audit.EventDenied, map[string]any{"publicCode": "POLICY_DENIED"}),
			ev(audit.EventFailed, map[string]any{"code": "POLICY_DENIED"})}, audit.EntryFailed, "POLICY_DENIED", 0, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := auditemit.EntryOf(tc.evs)
			if tc.wantStatus == "" {
				if e != nil {
					t.Fatalf("entry %+v, want none", e)
				}
				return
			}
			if e == nil {
				t.Fatalf("no entry, want %s", tc.wantStatus)
			}
			if e.Status != tc.wantStatus || e.Code != tc.wantCode || e.Attempts != tc.attempts || e.ApprovalID != tc.approval || e.Resumed != tc.resumed {
				t.Fatalf("entry %+v, want status %s code %q attempts %d approval %q resumed %v", e, tc.wantStatus, tc.wantCode, tc.attempts, tc.approval, tc.resumed)
			}
			if e.ExecutionID != "exec-1" || e.Principal != "alice" || e.CapabilityID != "demo.echo" || e.Actor.ID != "alice" {
				t.Fatalf("entry %+v: the execution's identity is lost", e)
			}
		})
	}
}
