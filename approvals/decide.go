package approvals

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/nats-io/nats.go"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/broker"
)

// ErrForbidden: the principal may not decide this approval (not an approver,
// or not of its types).
var ErrForbidden = errors.New("capstan: not allowed to decide this approval")

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
	Record *Record `json:"record,omitempty"`
	// Error and Conditions carry a refusal: the message, and the names of
	// the sentinel errors (not_found, expired, consumed, …) that
	// RequestDecision and ListReply.Err turn back into errors errors.Is knows.
	Error      string   `json:"error,omitempty"`
	Conditions []string `json:"conditions,omitempty"` // set with Error; see above
	// AuditUnavailable: the decision stands but its audit event is not stored.
	AuditUnavailable bool `json:"auditUnavailable,omitempty"`
	// Details are a refusal's structured facts: for quota_exceeded, the
	// quota, its limit and retryAfterMs (envelope.QuotaExceeded).
	Details map[string]any `json:"details,omitempty"`
}

// RequestDecision sends req to the workers as principal (the connection's,
// see broker.PrincipalOf) and returns the decided record. A refusal is an
// error that errors.Is matches against the store's conditions (ErrSelfApproval,
// ErrForbidden, ErrAlreadyDecided...). A decision whose audit event is
// missing returns the record and an error matching audit.ErrUnavailable.
func RequestDecision(ctx context.Context, nc *nats.Conn, n broker.Names, req DecideRequest) (*Record, error) {
	req.V = envelope.Version
	var reply DecideReply
	if err := request(ctx, nc, n.DecideSubject(broker.PrincipalOf(nc, n)), "decide "+req.ApprovalID, &req, &reply); err != nil {
		return nil, err
	}
	if reply.Error == "" {
		return reply.Record, nil
	}
	return reply.Record, refusal(reply.Error, reply.Conditions, reply.Details)
}

// conditionNames name the store's conditions on the wire.
var conditionNames = []struct {
	name string
	err  error
}{
	{"not_found", ErrNotFound}, {"pending", ErrPending}, {"rejected", ErrRejected},
	{"cancelled", ErrCancelled}, {"expired", ErrExpired}, {"consumed", ErrConsumed},
	{"already_decided", ErrAlreadyDecided}, {"self_approval", ErrSelfApproval},
	{"input_mismatch", ErrInputMismatch}, {"invalid", ErrInvalid}, {"forbidden", ErrForbidden},
	{"audit_unavailable", audit.ErrUnavailable}, {"quota_exceeded", envelope.ErrQuotaExceeded},
}

// Conditions are the names of the store's conditions err matches, as a
// refusal carries them on the wire (DecideReply.Conditions,
// ListReply.Conditions): not_found, expired, consumed, ...
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

// ListRequest asks the workers for a page of approvals, as Filter selects
// them, or for the one named by ID. An approver receives the approvals of
// types it may decide, and any principal the approvals it requested itself (a
// producer follows its own calls' approvals so); on an open server, every
// one. A page holds each requesting principal's approvals oldest first
// (Newest: newest first), the principals taking turns, one approval each, so
// that no principal's approvals hide another's (DESIGN §7).
type ListRequest struct {
	// V is the body's schema version.
	V int `json:"v"`
	// ID asks for one approval; the other fields filter a listing.
	ID string `json:"id,omitempty"`
	// Status is as of now: an approval past its expiry lists as expired.
	Status Status `json:"status,omitempty"`
	// CapabilityID keeps the approvals of one capability.
	CapabilityID string `json:"capabilityId,omitempty"`
	// Actor keeps the approvals one requester asked for.
	Actor envelope.Actor `json:"actor,omitzero"`
	// Limit is the page's size: default DefaultPageSize, at most MaxPageSize.
	Limit int `json:"limit,omitempty"`
	// Cursor is a page's Next: where the next page begins.
	Cursor string `json:"cursor,omitempty"`
	// Decided keeps the approvals no longer pending as of now (approved,
	// rejected, cancelled, expired, consumed); not with Status.
	Decided bool `json:"decided,omitempty"`
	// Newest lists each requester's approvals newest first.
	Newest bool `json:"newest,omitempty"`
}

// Page sizes of an approvals listing.
const (
	// DefaultPageSize is a page's size when the request names none.
	DefaultPageSize = 50
	// MaxPageSize is the largest page a request may ask for.
	MaxPageSize = 500
)

// ListReply is the workers' answer to a ListRequest: one page.
type ListReply struct {
	// V is the body's schema version.
	V int `json:"v"`
	// Records are the page's approvals, in the listing's order.
	Records []*Record `json:"records"`
	// Error and Conditions carry a refusal: the message, and the names of
	// the sentinel errors (not_found, expired, consumed, …) that
	// RequestDecision and ListReply.Err turn back into errors errors.Is knows.
	Error      string   `json:"error,omitempty"`
	Conditions []string `json:"conditions,omitempty"` // set with Error; see above
	// Next is the cursor of the next page; "" when nothing more matches. A
	// page holds fewer records than asked when more would not fit in one
	// reply (the payload the principal may receive).
	Next string `json:"next,omitempty"`
	// Trimmed names the records sent without their input and display: alone,
	// they would not fit in a reply. InputHash still names the input.
	Trimmed []string `json:"trimmed,omitempty"`
	// Details are a refusal's structured facts: for quota_exceeded, the
	// quota, its limit and retryAfterMs (envelope.QuotaExceeded).
	Details map[string]any `json:"details,omitempty"`
}

// Err is the refusal r carries, nil when it carries a page: an error that
// errors.Is matches against the store's conditions (ErrNotFound,
// ErrForbidden, ...), or the *envelope.CapabilityError of a quota
// (envelope.ErrQuotaExceeded).
func (r *ListReply) Err() error {
	if r.Error == "" {
		return nil
	}
	return refusal(r.Error, r.Conditions, r.Details)
}

// notFound is the refusal of an approval id that names nothing the asker
// may see: the same, word for word, whether the approval does not exist or
// is another's.
func notFound(id string) error { return fmt.Errorf("%w: %s", ErrNotFound, id) }

// request sends req to subject and decodes the workers' answer into reply;
// what names the request in errors.
func request(ctx context.Context, nc *nats.Conn, subject, what string, req, reply any) error {
	b, err := envelope.Marshal(req)
	if err != nil {
		return err
	}
	m, err := nc.RequestWithContext(ctx, subject, b)
	if err != nil {
		return fmt.Errorf("capstan: %s: %w", what, err)
	}
	if err := envelope.Unmarshal(m.Data, reply); err != nil {
		return fmt.Errorf("capstan: %s: reply: %w", what, err)
	}
	return nil
}
