package notify

import (
	"encoding/json"
	"time"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/envelope"
)

// PayloadVersion is the version of Payload's shape.
const PayloadVersion = 1

// Payload is the JSON body a webhook channel posts. Its IdempotencyKey is
// also in the Capstan-Idempotency-Key header; a receiver that has seen a key
// drops the delivery (it is at least once: a notifier that stopped
// mid-delivery sends again, with the same key).
type Payload struct {
	// V is PayloadVersion.
	V int `json:"v"`
	// IdempotencyKey names this event of this approval: the same on every
	// delivery of it.
	IdempotencyKey string `json:"idempotencyKey"`
	// Event is what happened: one of the Event constants, also in the
	// Capstan-Event header.
	Event Event `json:"event"`
	// OccurredAt is when the event happened: the request, the decision or
	// the expiry.
	OccurredAt time.Time `json:"occurredAt"`
	// URL is the approval's page in the console, when one is configured.
	URL string `json:"url,omitempty"`
	// Approval is the approval as of the event.
	Approval Approval `json:"approval"`
}

// Approval is an approval as a notification shows it. Input is what an
// approver is shown: the capability's redacted display when it declares one
// (InputRedacted), and never then the input itself.
type Approval struct {
	// ID is the approval's.
	ID string `json:"id"`
	// CapabilityID, Surface and Actor are the call's: what it calls, where
	// it came from, who it runs for (the requester).
	CapabilityID string         `json:"capabilityId"`
	Surface      string         `json:"surface,omitempty"` // "direct", "mcp" or "http"
	Actor        envelope.Actor `json:"actor"`             // who the call runs for, not the approver
	// Principal is the authenticated principal that requested the call.
	Principal string `json:"principal,omitempty"`
	// Types are the kinds of approver that may decide it.
	Types []string `json:"types,omitempty"`
	// Reasons say why an approval is needed.
	Reasons []string `json:"reasons,omitempty"`
	// Risk and SideEffect are the capability's.
	Risk       string `json:"risk,omitempty"`
	SideEffect string `json:"sideEffect,omitempty"` // none, read, write, destructive or external
	// RequestedAt is when the call asked; ExpiresAt when the approval
	// stops being decidable or, once approved, consumable.
	RequestedAt time.Time `json:"requestedAt"`
	ExpiresAt   time.Time `json:"expiresAt"` // see RequestedAt
	// Status is the approval's status as of the event.
	Status approvals.Status `json:"status"`
	// Decision is the approver's, on a decision's event.
	Decision *Decision `json:"decision,omitempty"`
	// RequestedBy is the execution that asked; CorrelationID its.
	RequestedBy   string `json:"requestedBy"`
	CorrelationID string `json:"correlationId,omitempty"` // the requesting execution's; empty for none
	// InputHash is the SHA-256 of the whole input the approval binds.
	InputHash string `json:"inputHash"`
	// Input is what an approver is shown of it (canonical JSON), left out
	// beyond 64 KiB; InputRedacted says it is the capability's display,
	// InputOmittedBytes how large what was left out is.
	Input             json.RawMessage `json:"input,omitempty"`
	InputRedacted     bool            `json:"inputRedacted,omitempty"`     // Input is the capability's display, not the input
	InputOmittedBytes int             `json:"inputOmittedBytes,omitempty"` // the size of an Input left out; 0 when it is there
}

// Decision is who decided an approval, when and why.
type Decision struct {
	// Status is approved, rejected or cancelled.
	Status approvals.Status `json:"status"`
	// Approver decided (or cancelled), at DecidedAt, with Comment.
	Approver  envelope.Actor `json:"approver"`
	Comment   string         `json:"comment,omitempty"` // the approver's comment; empty for none
	DecidedAt time.Time      `json:"decidedAt"`         // when the decision was recorded
}

// Event is what happened to an approval, as Payload.Event names it.
type Event string

// Events of an approval: requested when it starts to wait, then one of
// approved, rejected or cancelled when it is decided, or expired when nobody
// decided it in time.
const (
	EventRequested Event = "approval.requested"
	EventApproved  Event = "approval.approved"
	EventRejected  Event = "approval.rejected"
	EventCancelled Event = "approval.cancelled"
	EventExpired   Event = "approval.expired"
)
