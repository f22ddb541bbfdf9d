package audit

import (
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/msgenc"
)

// The executions index (DESIGN §3, "Listing executions"): a projection of
// the trail, one small entry per audit message that begins or ends an
// execution, on a subject that carries what a listing filters by. The
// emitter writes it with the trail; listings read it newest first (List).

// Statuses of an index entry. An entry says what an execution was when it
// was written; a later entry of the same execution supersedes it.
const (
	// EntryQueued is no entry of the index: a listing shows a request still
	// waiting in its queue, that no worker has taken, with this status.
	EntryQueued           = "queued"
	EntryRunning          = "running"
	EntryApprovalRequired = "approval-required"
	EntryCompleted        = "completed"
	EntryFailed           = "failed"
	EntryCancelled        = "cancelled"
)

// EntryStatuses are the statuses an entry may have, in the order a listing
// offers them.
var EntryStatuses = []string{EntryQueued, EntryRunning, EntryApprovalRequired, EntryCompleted, EntryFailed, EntryCancelled}

// Entry is one execution as the index tells it: what a listing shows. It
// holds no input and no output (SI-10), as the trail does not.
type Entry struct {
	V           int    `json:"v"`           // the schema version, envelope.Version
	ExecutionID string `json:"executionId"` // the execution listed
	// Principal is the principal the request came from; the anonymous
	// principal (broker.Anonymous) when its events name none.
	Principal    string `json:"principal"`
	CapabilityID string `json:"capabilityId"`      // the capability called
	Actor        Actor  `json:"actor"`             // who the execution runs for
	Surface      string `json:"surface,omitempty"` // "direct", "mcp" or "http"
	// Status is one of the Entry* statuses; Code the error code of a
	// failed or cancelled execution.
	Status string `json:"status"`
	Code   string `json:"code,omitempty"` // see Status
	// Attempts is the highest attempt its events name: 0 for an execution
	// that never ran its handler.
	Attempts int `json:"attempts,omitempty"`
	// DurationMs is the envelope's duration in milliseconds, once ended.
	DurationMs int64 `json:"durationMs,omitempty"`
	// ApprovalID is the approval the execution asked for (approval-required)
	// or consumed (Resumed).
	ApprovalID string `json:"approvalId,omitempty"`
	Resumed    bool   `json:"resumed,omitempty"` // the execution is a resume that consumed ApprovalID
	// RequestedAt is when a worker took the request (its requested event),
	// zero when the message did not hold it; UpdatedAt when the entry's last
	// event happened.
	RequestedAt time.Time `json:"requestedAt,omitzero"`
	UpdatedAt   time.Time `json:"updatedAt"` // see RequestedAt

	// Seq is the index stream's sequence of the entry, set by List; it is
	// the cursor of a listing. Not part of the record.
	Seq uint64 `json:"seq,omitempty"`
	// part is the entry's place in its message, oldest first: a message of
	// the index holds the entries that ended close together on one subject
	// (indexgroups.go).
	part int
}

// Ended reports whether the entry is an execution's end.
func (e *Entry) Ended() bool { return e.Status != EntryRunning && e.Status != EntryQueued }

// EncodeMsgpack writes the entry without reflection, in the bytes the
// reflective encoder writes: one is written per execution.
func (e Entry) EncodeMsgpack(enc *msgpack.Encoder) error {
	var f msgenc.Fields
	f.Int("v", int64(e.V))
	f.String("executionId", e.ExecutionID)
	f.String("principal", e.Principal)
	f.String("capabilityId", e.CapabilityID)
	f.Actor("actor", e.Actor.ID, e.Actor.Kind, nil)
	f.String("surface", e.Surface)
	f.String("status", e.Status)
	f.String("code", e.Code)
	f.Int("attempts", int64(e.Attempts))
	f.Int("durationMs", e.DurationMs)
	f.String("approvalId", e.ApprovalID)
	f.Bool("resumed", e.Resumed)
	f.Time("requestedAt", e.RequestedAt)
	f.Time("updatedAt", e.UpdatedAt)
	f.Int("seq", int64(e.Seq))
	return f.Encode(enc)
}

// decodeEntries reads a message of the index: one entry, or several
// (entries of executions that ended close together, oldest first) as an
// array of entries, as the trail stores several events.
func decodeEntries(b []byte) ([]Entry, error) {
	es, err := decodeOneOrMany[Entry](b, "index entry", "index entries")
	for i := range es {
		es[i].part = i
	}
	return es, err
}

// entryOf returns the index entry of one audit message's events (all of one
// execution, in order), or nil when they neither begin nor end it: an
// execution's end (completed, failed, cancelled, or approval-required) makes
// an entry with its outcome; its requested event, without an end in the same
// message, one that says it runs. A quick execution's events are one message,
// hence one entry; a long one has two, the later superseding. A retry's or a
// takeover's events make none.
func entryOf(evs []*Event) *Entry {
	var e *Entry
	begins := false
	for _, ev := range evs {
		if ev == nil || ev.ExecutionID == "" {
			continue
		}
		if e == nil {
			e = &Entry{V: envelope.Version, ExecutionID: ev.ExecutionID}
		}
		if e.CapabilityID == "" {
			e.CapabilityID = ev.CapabilityID
		}
		if e.Actor == (Actor{}) {
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
		case EventRequested:
			begins = true
			e.RequestedAt = ev.Timestamp
			e.Actor, e.Principal, e.Surface = ev.Actor, ev.Principal, ev.Surface
		case EventStarted:
			if id, _ := ev.Data["approvalId"].(string); id != "" {
				e.ApprovalID, e.Resumed = id, true
			}
		case EventApprovalConsumed:
			if id, _ := ev.Data["approvalId"].(string); id != "" {
				e.ApprovalID, e.Resumed = id, true
			}
		case EventCompleted:
			e.Status, e.Code = EntryCompleted, ""
		case EventFailed:
			e.Status, e.Code = EntryFailed, str(ev.Data["code"])
		case EventCancelled:
			e.Status, e.Code = EntryCancelled, str(ev.Data["code"])
		case EventApprovalRequested:
			e.Status = EntryApprovalRequired
			if id, _ := ev.Data["approvalId"].(string); id != "" {
				e.ApprovalID = id
			}
		}
		if n, ok := number(ev.Data["attempts"]); ok {
			e.Attempts = max(e.Attempts, int(n))
		}
		if n, ok := number(ev.Data["attempt"]); ok && ev.Type == EventStarted {
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
		e.Status = EntryRunning
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
