package audit

import (
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/capstan-dev/capstan/internal/msgenc"
)

// The executions index (DESIGN §3, "Listing executions"): a projection of
// the trail, one small entry per audit message that begins or ends an
// execution, on a subject that carries what a listing filters by. The
// emitter writes it with the trail; listings read it newest first (List).

// Statuses of an index entry. An entry says what an execution was when it
// was written; a later entry of the same execution supersedes it.
const (
	// EntryQueued: waiting in its queue. A listing shows a request no
	// worker has taken with it (no entry of the index), and the index has
	// it for an execution an operator's pause or a limit's wait gave back.
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
	// (the emitter's grouping, internal/auditemit).
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
