package audit

import (
	"fmt"
	"time"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/vmihailenco/msgpack/v5"
)

// Event types of DESIGN §8.
const (
	Requested         = "capability.requested"
	Denied            = "capability.denied"
	ApprovalRequested = "capability.approval_requested"
	Approved          = "capability.approved"
	Rejected          = "capability.rejected"
	Started           = "capability.started"
	Retried           = "capability.retried"
	Completed         = "capability.completed"
	Failed            = "capability.failed"
	Cancelled         = "capability.cancelled"
	Discovered        = "capabilities.discovered"
	DuplicateDelivery = "execution.duplicate_delivery"
	TakenOver         = "execution.taken_over"
	EnvelopeConflict  = "envelope.conflict"
	ApprovalConsumed  = "approval.consumed"
)

// Actor is the acting party of an event: id and kind, never attributes.
type Actor struct {
	ID   string `json:"id"`
	Kind string `json:"kind"`
}

// ActorOf keeps what the trail may carry of an actor.
func ActorOf(a envelope.Actor) Actor { return Actor{ID: a.ID, Kind: a.Kind} }

// Event is one audit record. Data holds the type's own fields; it never holds
// raw input or output (SI-10).
type Event struct {
	V         int       `json:"v"`
	Type      string    `json:"type"`
	Timestamp time.Time `json:"timestamp"`
	Surface   string    `json:"surface,omitempty"`
	Actor     Actor     `json:"actor"`
	// Principal is the authenticated NATS principal the request came from
	// (the token of the subject the server let it publish on); the actor is
	// what that principal asserted, within its grant.
	Principal     string `json:"principal,omitempty"`
	ExecutionID   string `json:"executionId,omitempty"`
	CapabilityID  string `json:"capabilityId,omitempty"`
	CorrelationID string `json:"correlationId,omitempty"`
	InputHash     string `json:"inputHash,omitempty"`
	Worker        string `json:"worker,omitempty"`
	// TraceID is the W3C trace id of the execution's trace (from the
	// request's traceparent), so that a trail and a trace find each other.
	TraceID string         `json:"traceId,omitempty"`
	Data    map[string]any `json:"data,omitempty"`

	// Seq is the event's sequence in the audit stream, set by Read and Follow.
	// It is not part of the record.
	Seq uint64 `json:"-"`
}

// Decode reads one event as it is stored on the stream.
func Decode(b []byte) (*Event, error) {
	ev := new(Event)
	if err := envelope.Unmarshal(b, ev); err != nil {
		return nil, fmt.Errorf("capstan: audit event: %w", err)
	}
	return ev, nil
}

// EncodeMsgpack writes the event without reflection: several are written per
// execution.
func (e Event) EncodeMsgpack(enc *msgpack.Encoder) error {
	var f envelope.Fields
	f.Int("v", int64(e.V))
	f.String("type", e.Type)
	f.Time("timestamp", e.Timestamp)
	f.String("surface", e.Surface)
	f.Actor("actor", e.Actor.ID, e.Actor.Kind, nil)
	f.String("principal", e.Principal)
	f.String("executionId", e.ExecutionID)
	f.String("capabilityId", e.CapabilityID)
	f.String("correlationId", e.CorrelationID)
	f.String("inputHash", e.InputHash)
	f.String("worker", e.Worker)
	f.String("traceId", e.TraceID)
	f.Value("data", e.Data, len(e.Data) == 0)
	return f.Encode(enc)
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
