package approvalsrpc

import (
	"errors"
	"slices"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
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

// conditionNames name the approvals' conditions on the wire.
var conditionNames = []struct {
	name string
	err  error
}{
	{"not_found", approvals.ErrNotFound}, {"pending", approvals.ErrPending}, {"rejected", approvals.ErrRejected},
	{"cancelled", approvals.ErrCancelled}, {"expired", approvals.ErrExpired}, {"consumed", approvals.ErrConsumed},
	{"already_decided", approvals.ErrAlreadyDecided}, {"self_approval", approvals.ErrSelfApproval},
	{"input_mismatch", approvals.ErrInputMismatch}, {"invalid", approvals.ErrInvalid}, {"forbidden", approvals.ErrForbidden},
	{"audit_unavailable", audit.ErrUnavailable}, {"quota_exceeded", envelope.ErrQuotaExceeded},
}

// Conditions are the names of the approvals' conditions err matches, as a
// refusal carries them on the wire (DecideReply.Conditions,
// approvals.ListReply.Conditions): not_found, expired, consumed, ...
func Conditions(err error) []string {
	var out []string
	for _, c := range conditionNames {
		if errors.Is(err, c.err) {
			out = append(out, c.name)
		}
	}
	return out
}

func errorsOf(names []string) []error {
	var out []error
	for _, n := range names {
		for _, c := range conditionNames {
			if c.name == n {
				out = append(out, c.err)
			}
		}
	}
	return out
}

// ListErr is the refusal r carries, nil when it carries a page: an error
// that errors.Is matches against the approvals' conditions
// (approvals.ErrNotFound, approvals.ErrForbidden, ...), or the
// *envelope.CapabilityError of a quota (envelope.ErrQuotaExceeded).
func ListErr(r *approvals.ListReply) error {
	if r.Error == "" {
		return nil
	}
	return refusal(r.Error, r.Conditions, r.Details)
}

// refusal is the error of a refusal a worker answered: a quota's is the
// *envelope.CapabilityError it was made from, any other matches the
// conditions it named.
func refusal(msg string, conds []string, details map[string]any) error {
	if slices.Contains(conds, "quota_exceeded") {
		return envelope.QuotaRefusal(msg, details)
	}
	return &remoteError{msg: msg, conds: errorsOf(conds)}
}

// remoteError is a refusal answered by a worker, matching the conditions it named.
type remoteError struct {
	msg   string
	conds []error
}

func (e *remoteError) Error() string   { return e.msg }
func (e *remoteError) Unwrap() []error { return e.conds }
