package audit

import (
	"errors"
	"fmt"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/msgenc"
)

// Event types of DESIGN §8.
const (
	EventRequested = "capability.requested"
	EventDenied    = "capability.denied"
	// EventLimited: a limit of the capability held the call back (DESIGN §17):
	// data names the limit, its usage, and what the call did (wait, refuse,
	// approval).
	EventLimited           = "capability.limited"
	EventApprovalRequested = "capability.approval_requested"
	EventApproved          = "capability.approved"
	EventRejected          = "capability.rejected"
	EventStarted           = "capability.started"
	EventRetried           = "capability.retried"
	EventCompleted         = "capability.completed"
	EventFailed            = "capability.failed"
	EventCancelled         = "capability.cancelled"
	EventDiscovered        = "capabilities.discovered"
	EventDuplicateDelivery = "execution.duplicate_delivery"
	// EventExpiredRequest: a request whose id is older than envelopes are kept was
	// refused without running.
	EventExpiredRequest   = "execution.expired_request"
	EventTakenOver        = "execution.taken_over"
	EventEnvelopeConflict = "envelope.conflict"
	EventApprovalConsumed = "approval.consumed"
	// EventReceiptRecorded: an attempt's handler recorded the evidence of its
	// effect (DESIGN §5); the event names it by its hash, never its content.
	EventReceiptRecorded = "capability.receipt_recorded"
	// EventReconciled: the capability's reconciler answered whether a lost
	// attempt took effect.
	EventReconciled = "capability.reconciled"
	// EventPaused: an admin paused calls (DESIGN §18); the event is filed
	// under an id of its own, with the admin's principal: data says what,
	// how (hold or refuse), why, and the revision of the bucket it follows.
	EventPaused = "operator.paused"
	// EventUnpaused: an admin lifted a pause; data says which, and why.
	EventUnpaused = "operator.unpaused"
	// EventPoliciesApplied: an admin put a Cedar policy set in force
	// (DESIGN §18), or removed it (data.version 0); data names the version,
	// its hash and why.
	EventPoliciesApplied = "operator.policies_applied"
	// EventNotApplied: an operator's change the trail recorded (a pause, a
	// lift, a policy set) did not reach the bucket; data names the event
	// and the error. Nothing changed.
	EventNotApplied = "operator.not_applied"
	// EventHeld: an operator's pause held the call back in its queue; data
	// names the pause.
	EventHeld = "capability.held"
)

// ErrUnavailable marks an audit event JetStream did not store when it had
// to: with strict mode (executor.WorkerConfig.StrictAudit) an execution
// then fails AUDIT_UNAVAILABLE; an approval's decision that stands
// without its event wraps it. Compare with errors.Is.
var ErrUnavailable = errors.New("capstan: audit unavailable")

// Actor is the acting party of an event: id and kind, never attributes.
type Actor struct {
	ID   string `json:"id"`   // the actor's id (envelope.Actor.ID)
	Kind string `json:"kind"` // user, service, agent or anonymous (envelope.Actor.Kind)
}

// ActorOf keeps what the trail may carry of an actor.
func ActorOf(a envelope.Actor) Actor { return Actor{ID: a.ID, Kind: a.Kind} }

// Event is one audit record. Data holds the type's own fields; it never holds
// raw input or output (SI-10).
type Event struct {
	// V is the schema version, envelope.Version; the emitter sets it.
	V int `json:"v"`
	// Type is one of the event types above (EventRequested, EventStarted, …).
	Type string `json:"type"`
	// Timestamp is when the event happened, in UTC: the emitter sets it
	// to the time of storing when it is zero.
	Timestamp time.Time `json:"timestamp"`
	// Surface is the request's surface ("direct", "mcp", "http").
	Surface string `json:"surface,omitempty"`
	// Actor is who the execution runs for; for an approval's decision, the
	// approver (or canceller).
	Actor Actor `json:"actor"`
	// Principal is the authenticated NATS principal the request came from
	// (the token of the subject the server let it publish on); the actor is
	// what that principal asserted, within its grant.
	Principal string `json:"principal,omitempty"`
	// ExecutionID is the execution the event is of: for an approval's
	// decision, the execution that asked for the approval; for a
	// discovery, the id its describe reply names (executor.Discovery.ID).
	ExecutionID string `json:"executionId,omitempty"`
	// CapabilityID is the capability called; empty for a discovery, and
	// for a request that named none the worker could read.
	CapabilityID string `json:"capabilityId,omitempty"`
	// CorrelationID is the request's correlation id, tying executions
	// together; empty for none.
	CorrelationID string `json:"correlationId,omitempty"`
	// InputHash names the input by its hash (envelope.InputHash), never its
	// content; empty for an event without an input (a discovery).
	InputHash string `json:"inputHash,omitempty"`
	// Worker is the id of the worker that emitted the event; empty for an
	// approval's decision events, which the approvals store emits.
	Worker string `json:"worker,omitempty"`
	// TraceID is the W3C trace id of the execution's trace (from the
	// request's traceparent), so that a trail and a trace find each other.
	TraceID string `json:"traceId,omitempty"`
	// Data holds the fields of the event's type (a failure's code and
	// stage, an attempt's number, a duration in milliseconds, …); never the
	// input or the output.
	Data map[string]any `json:"data,omitempty"`

	// Seq is the stream sequence of the message the event was stored in, set
	// by Read and Follow. Several events of one execution can share a message
	// (see Decode); Index is the event's place in it, from 0. Neither is
	// part of the record.
	Seq   uint64 `json:"-"`
	Index int    `json:"-"` // the event's place in its message, from 0
}

// Key is the key of the event's execution (broker.Key): its principal, the
// anonymous one when it names none, and its id. An execution's events are
// stored and read by it, so that another principal's events under the same
// id are never part of its trail.
func (ev *Event) Key() string { return broker.Key(ev.principal(), ev.ExecutionID) }

// principal is the event's principal, the anonymous one when it names none
// (an open server's, or an event of an earlier version).
func (ev *Event) principal() string {
	if ev.Principal == "" {
		return broker.Anonymous
	}
	return ev.Principal
}

// Decode returns the events of one stored audit message, in the order they
// were emitted, with Index set: a message of several events of one execution
// (a msgpack array, as a worker stores a quick execution's events) or of one
// (a msgpack map, as a single event is stored, and every event by earlier
// versions).
func Decode(b []byte) ([]Event, error) {
	evs, err := decodeOneOrMany[Event](b, "audit event", "audit events")
	for i := range evs {
		evs[i].Index = i
	}
	return evs, err
}

// decodeOneOrMany reads a stored message of records of type T: one (a
// msgpack map) or several (a non-empty array of them); what names the
// record in an error, whats several.
func decodeOneOrMany[T any](b []byte, what, whats string) ([]T, error) {
	if !isArray(b) {
		var one T
		if err := envelope.Unmarshal(b, &one); err != nil {
			return nil, fmt.Errorf("capstan: %s: %w", what, err)
		}
		return []T{one}, nil
	}
	var many []T
	if err := envelope.Unmarshal(b, &many); err != nil {
		return nil, fmt.Errorf("capstan: %s: %w", whats, err)
	}
	if len(many) == 0 {
		return nil, fmt.Errorf("capstan: %s: %w: an empty array", whats, envelope.ErrDecode)
	}
	return many, nil
}

// isArray reports whether b starts with a msgpack array.
func isArray(b []byte) bool {
	return len(b) > 0 && (b[0]&0xf0 == 0x90 || b[0] == 0xdc || b[0] == 0xdd)
}

// EncodeMsgpack writes the event without reflection: several are written per
// execution.
func (e Event) EncodeMsgpack(enc *msgpack.Encoder) error {
	var f msgenc.Fields
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
