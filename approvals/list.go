package approvals

import "github.com/capstan-dev/capstan/envelope"

// ListRequest asks the workers for a page of approvals
// (executor.Client.ListApprovals), or for the one named by ID. An approver
// receives the approvals of types it may decide, and any principal the
// approvals it requested itself (a producer follows its own calls'
// approvals so); on an open server, every one. A page holds each requesting
// principal's approvals oldest first (Newest: newest first), the principals
// taking turns, one approval each, so that no principal's approvals hide
// another's (DESIGN §7).
type ListRequest struct {
	// V is the body's schema version; the client sets it.
	V int `json:"v"`
	// ID asks for one approval; the other fields filter a listing.
	ID string `json:"id,omitempty"`
	// Status is as of now: an approval past its expiry lists as expired.
	Status Status `json:"status,omitempty"`
	// CapabilityID keeps the approvals of one capability.
	CapabilityID string `json:"capabilityId,omitempty"`
	// Actor keeps the approvals one requester asked for.
	Actor envelope.Actor `json:"actor,omitzero"`
	// Limit is the page's size: 50 when zero, at most 500 (a larger
	// Limit is read as 500).
	Limit int `json:"limit,omitempty"`
	// Cursor is a page's Next: where the next page begins.
	Cursor string `json:"cursor,omitempty"`
	// Decided keeps the approvals no longer pending as of now (approved,
	// rejected, cancelled, expired, consumed); not with Status.
	Decided bool `json:"decided,omitempty"`
	// Newest lists each requester's approvals newest first.
	Newest bool `json:"newest,omitempty"`
}

// ListReply is the workers' answer to a ListRequest: one page. A refusal
// reaches executor.Client.ListApprovals's caller as its error, which
// errors.Is matches against this package's conditions (ErrNotFound,
// ErrForbidden, ...) or envelope.ErrQuotaExceeded.
type ListReply struct {
	// V is the body's schema version.
	V int `json:"v"`
	// Records are the page's approvals, in the listing's order.
	Records []*Record `json:"records"`
	// Error and Conditions carry a refusal on the wire: the message, and
	// the names of the conditions (not_found, expired, consumed, …) the
	// client turns back into errors errors.Is knows.
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
