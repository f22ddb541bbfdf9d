package auditemit

import (
	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/broker"
)

// entryOf returns the index entry of one audit message's events (all of one
// execution, in order), or nil when they neither begin nor end it: an
// execution's end (completed, failed, cancelled, or approval-required) makes
// an entry with its outcome; its requested event or an attempt's start,
// without an end in the same message, one that says it runs; an operator's
// pause holding it or a limit it waits at, one that says it is queued
// (given back to its queue until the pause ends or the limit lets it),
// until its start says it runs again. A quick execution's events are one
// message, hence one entry; a long one has two, the later superseding. A
// retry's wait, a duplicate delivery and an approval's decision make none.
func entryOf(evs []*audit.Event) *audit.Entry {
	var e *audit.Entry
	begins := false
	for _, ev := range evs {
		if ev == nil || ev.ExecutionID == "" {
			continue
		}
		if e == nil {
			e = &audit.Entry{V: envelope.Version, ExecutionID: ev.ExecutionID}
		}
		if e.CapabilityID == "" {
			e.CapabilityID = ev.CapabilityID
		}
		if e.Actor == (audit.Actor{}) {
			e.Actor = ev.Actor
		}
		if e.Principal == "" {
			e.Principal = ev.Principal
		}
		if e.Surface == "" {
			e.Surface = ev.Surface
		}
		e.UpdatedAt = ev.Timestamp
		switch ev.Type {
		case audit.EventRequested:
			begins = true
			e.RequestedAt = ev.Timestamp
			e.Actor, e.Principal, e.Surface = ev.Actor, ev.Principal, ev.Surface
		case audit.EventStarted:
			begins = true
			if id, _ := ev.Data["approvalId"].(string); id != "" {
				e.ApprovalID, e.Resumed = id, true
			}
		case audit.EventApprovalConsumed:
			if id, _ := ev.Data["approvalId"].(string); id != "" {
				e.ApprovalID, e.Resumed = id, true
			}
		case audit.EventHeld:
			e.Status = audit.EntryQueued
		case audit.EventLimited:
			if ev.Data["action"] == "wait" {
				e.Status = audit.EntryQueued // given back to its queue until the limit lets it
			}
		case audit.EventCompleted:
			e.Status, e.Code = audit.EntryCompleted, ""
		case audit.EventFailed:
			e.Status, e.Code = audit.EntryFailed, str(ev.Data["code"])
		case audit.EventCancelled:
			e.Status, e.Code = audit.EntryCancelled, str(ev.Data["code"])
		case audit.EventApprovalRequested:
			e.Status = audit.EntryApprovalRequired
			if id, _ := ev.Data["approvalId"].(string); id != "" {
				e.ApprovalID = id
			}
		}
		if n, ok := number(ev.Data["attempts"]); ok {
			e.Attempts = max(e.Attempts, int(n))
		}
		if n, ok := number(ev.Data["attempt"]); ok && ev.Type == audit.EventStarted {
			e.Attempts = max(e.Attempts, int(n))
		}
		if n, ok := number(ev.Data["durationMs"]); ok {
			e.DurationMs = n
		}
	}
	if e == nil {
		return nil
	}
	if e.Status == "" {
		if !begins {
			return nil
		}
		e.Status = audit.EntryRunning
	}
	if e.Principal == "" {
		e.Principal = broker.Anonymous
	}
	return e
}

func str(v any) string {
	s, _ := v.(string)
	return s
}

// number reads an integer of an event's data, whatever width msgpack or the
// emitter gave it.
func number(v any) (int64, bool) {
	switch n := v.(type) {
	case int:
		return int64(n), true
	case int8:
		return int64(n), true
	case int16:
		return int64(n), true
	case int32:
		return int64(n), true
	case int64:
		return n, true
	case uint8:
		return int64(n), true
	case uint16:
		return int64(n), true
	case uint32:
		return int64(n), true
	case uint64:
		return int64(n), true
	case float64:
		return int64(n), true
	case float32:
		return int64(n), true
	}
	return 0, false
}

// eventCount is how many events a stored message holds, read from its
// array's header without decoding it.
func eventCount(b []byte) int {
	switch {
	case len(b) == 0:
		return 1
	case b[0]&0xf0 == 0x90:
		return max(int(b[0]&0x0f), 1)
	case b[0] == 0xdc && len(b) >= 3:
		return max(int(b[1])<<8|int(b[2]), 1)
	case b[0] == 0xdd && len(b) >= 5:
		return max(int(b[1])<<24|int(b[2])<<16|int(b[3])<<8|int(b[4]), 1)
	}
	return 1
}

// TraceID returns the trace id of a W3C traceparent
// ("00-<trace id>-<span id>-<flags>"), or "" when tp is not one.
func TraceID(tp string) string {
	if len(tp) < 55 || tp[2] != '-' || tp[35] != '-' {
		return ""
	}
	id := tp[3:35]
	for i := 0; i < len(id); i++ {
		if c := id[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return ""
		}
	}
	if id == "00000000000000000000000000000000" {
		return ""
	}
	return id
}
