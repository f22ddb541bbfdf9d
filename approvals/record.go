package approvals

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	"github.com/capstan-dev/capstan/envelope"
)

// Status is where an approval stands (DESIGN §7).
type Status string

// Statuses. Only pending may be decided and only approved may be consumed;
// every other status is final.
const (
	StatusPending   Status = "pending"
	StatusApproved  Status = "approved"
	StatusRejected  Status = "rejected"
	StatusExpired   Status = "expired"
	StatusCancelled Status = "cancelled"
	StatusConsumed  Status = "consumed"
)

// Decision is what an approver (or a canceller) decided.
type Decision struct {
	// Status is what the decision made of the approval: approved, rejected
	// or cancelled.
	Status Status `json:"status"`
	// Approver is who decided (or cancelled).
	Approver envelope.Actor `json:"approver"`
	// Comment is theirs, if any.
	Comment string `json:"comment,omitempty"`
	// DecidedAt is when.
	DecidedAt time.Time `json:"decidedAt"`
	// SelfApproval holds the reason given when the requester approved their
	// own call, which is refused without one.
	SelfApproval string `json:"selfApproval,omitempty"`
}

// Record is one approval in the approvals bucket, changed only by
// compare-and-swap on its revision.
type Record struct {
	// V is the record's schema version.
	V int `json:"v"`
	// ID is the approval's.
	ID string `json:"id"`
	// CapabilityID, Surface and Actor are the call's: what it calls, where
	// it came from, who it runs for (the requester).
	CapabilityID string         `json:"capabilityId"`
	Surface      string         `json:"surface,omitempty"` // "direct", "mcp" or "http"
	Actor        envelope.Actor `json:"actor"`             // who the call runs for, not the approver
	// Input is the validated input as canonical JSON; InputHash is its SHA-256.
	Input     json.RawMessage `json:"input"`
	InputHash string          `json:"inputHash"` // hex SHA-256 of Input; CheckInput checks it
	// Display is what an approver is shown of the input when the capability
	// redacts it (canonical JSON); the approval still binds the whole Input.
	Display json.RawMessage `json:"display,omitempty"`
	// Reasons say why an approval is needed (the rule's, the policies').
	Reasons []string `json:"reasons,omitempty"`
	// Types are the kinds of approver that may decide it (finance, …).
	Types []string `json:"types,omitempty"`
	// Risk and SideEffect are the capability's, shown to approvers.
	Risk       string `json:"risk,omitempty"`
	SideEffect string `json:"sideEffect,omitempty"` // none, read, write, destructive or external
	// RequestedAt is when the call asked; ExpiresAt when the approval
	// stops being decidable or, once approved, consumable.
	RequestedAt time.Time `json:"requestedAt"`
	ExpiresAt   time.Time `json:"expiresAt"` // RequestedAt plus the capability's TTL (15 minutes unless set)
	// Status is where the approval stands as last written (see StatusAt).
	Status Status `json:"status"`
	// Decision is the approver's (or canceller's), once decided.
	Decision *Decision `json:"decision,omitempty"`
	// RequestedBy is the execution that asked for the approval; its audit
	// trail carries the decision.
	RequestedBy string `json:"requestedBy"`
	// ConsumedBy is the one execution the approval authorized.
	ConsumedBy string `json:"consumedBy,omitempty"`
	// ConsumedAt is when that execution consumed it.
	ConsumedAt time.Time `json:"consumedAt,omitzero"`
	// ConsumedUnder names the execution record under which it was consumed:
	// that record's creation time (execution.Record.CreatedAt). Only a
	// delivery holding that same record — a takeover or redelivery of the
	// execution still in flight — may use the approval again; once the
	// record is gone, nothing runs under the approval again, whatever id it
	// names (DESIGN §7). Zero in a record consumed before it existed.
	ConsumedUnder time.Time `json:"consumedUnder,omitzero"`
	// Principal is the authenticated principal that requested the call: an
	// approver under the same principal is its requester.
	Principal string `json:"principal,omitempty"`
	// CorrelationID is the requesting execution's, carried to the decision events.
	CorrelationID string `json:"correlationId,omitempty"`
}

// StatusAt is the status as of t: a pending or approved approval whose
// expiry has passed is expired, whether or not the record says so yet.
func (r *Record) StatusAt(t time.Time) Status {
	if (r.Status == StatusPending || r.Status == StatusApproved) && !t.Before(r.ExpiresAt) {
		return StatusExpired
	}
	return r.Status
}

// Raw returns the stored input as a value to submit again.
func (r *Record) Raw() (envelope.Raw, error) {
	return envelope.RawFromJSON(r.Input)
}

// CheckInput re-hashes the stored input: its bytes must be the canonical JSON
// that hashes to InputHash. A record whose input was changed after it was
// requested, in meaning or only in form, fails with ErrInputMismatch.
func (r *Record) CheckInput() error {
	sum := sha256.Sum256(r.Input)
	if h := hex.EncodeToString(sum[:]); h != r.InputHash {
		return fmt.Errorf("%w: the stored input hashes to %s, the approval was for %s", ErrInputMismatch, h, r.InputHash)
	}
	if _, err := r.Raw(); err != nil {
		return fmt.Errorf("%w: the stored input does not parse: %v", ErrInputMismatch, err)
	}
	return nil
}

// Verdict is one approver's decision on a pending approval
// (executor.Client.Decide).
type Verdict struct {
	// Approve approves; false rejects.
	Approve bool
	// Approver is who decides: never the requester, unless SelfApproval.
	Approver envelope.Actor
	// Comment is the approver's, kept on the record and the trail.
	Comment string
	// SelfApproval lets the requester decide their own call; it is the reason
	// why, and it is kept on the record and in the trail. Empty refuses it.
	SelfApproval string
}
