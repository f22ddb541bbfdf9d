package approvalsrpc

import (
	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/wireerr"
)

// DecideRequest asks the workers to record a decision. The approver is the
// principal whose subject the request arrived on (the server lets a principal
// publish only there), never a field of the request.
type DecideRequest struct {
	// V is the body's schema version.
	V int `json:"v"`
	// ApprovalID is the approval decided.
	ApprovalID string `json:"approvalId"`
	// Approve approves; false rejects.
	Approve bool `json:"approve"`
	// Comment is the approver's, kept on the record and the trail.
	Comment string `json:"comment,omitempty"`
	// Approver and SelfApproval are read on an open server only, where no
	// principal is authenticated and the decision names its approver.
	Approver     envelope.Actor `json:"approver,omitzero"`
	SelfApproval string         `json:"selfApproval,omitempty"` // the reason a requester gives for approving its own call
}

// DecideReply is the workers' answer: the decided record, or the conditions
// that refused it.
type DecideReply struct {
	// V is the body's schema version.
	V int `json:"v"`
	// Record is the decided approval.
	Record *approvals.Record `json:"record,omitempty"`
	// Error and Conditions carry a refusal: the message, and the names of
	// the sentinel errors (not_found, expired, consumed, …) that Decide and
	// ListErr turn back into errors errors.Is knows.
	Error      string   `json:"error,omitempty"`
	Conditions []string `json:"conditions,omitempty"` // set with Error; see above
	// AuditUnavailable: the decision stands but its audit event is not stored.
	AuditUnavailable bool `json:"auditUnavailable,omitempty"`
	// Details are a refusal's structured facts: for quota_exceeded, the
	// quota, its limit and retryAfterMs (envelope.QuotaExceeded).
	Details map[string]any `json:"details,omitempty"`
}

// Page sizes of an approvals listing (approvals.ListRequest.Limit).
const (
	// DefaultPageSize is a page's size when the request names none.
	DefaultPageSize = 50
	// MaxPageSize is the largest page a request may ask for.
	MaxPageSize = 500
)

// conditions name the approvals' conditions on the wire.
var conditions = wireerr.Table{
	{Name: "not_found", Err: approvals.ErrNotFound}, {Name: "pending", Err: approvals.ErrPending},
	{Name: "rejected", Err: approvals.ErrRejected}, {Name: "cancelled", Err: approvals.ErrCancelled},
	{Name: "expired", Err: approvals.ErrExpired}, {Name: "consumed", Err: approvals.ErrConsumed},
	{Name: "already_decided", Err: approvals.ErrAlreadyDecided}, {Name: "self_approval", Err: approvals.ErrSelfApproval},
	{Name: "input_mismatch", Err: approvals.ErrInputMismatch}, {Name: "invalid", Err: approvals.ErrInvalid},
	{Name: "forbidden", Err: approvals.ErrForbidden}, {Name: "audit_unavailable", Err: audit.ErrUnavailable},
	{Name: "quota_exceeded", Err: envelope.ErrQuotaExceeded},
}

// Conditions are the names of the approvals' conditions err matches, as a
// refusal carries them on the wire (DecideReply.Conditions,
// approvals.ListReply.Conditions): not_found, expired, consumed, ...
func Conditions(err error) []string { return conditions.Names(err) }

// ListErr is the refusal r carries, nil when it carries a page: an error
// that errors.Is matches against the approvals' conditions
// (approvals.ErrNotFound, approvals.ErrForbidden, ...), or the
// *envelope.CapabilityError of a quota (envelope.ErrQuotaExceeded).
func ListErr(r *approvals.ListReply) error {
	if r.Error == "" {
		return nil
	}
	return conditions.Error(r.Error, r.Conditions, r.Details)
}
