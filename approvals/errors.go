package approvals

import "errors"

// The conditions an approval's operations fail with: compare with
// errors.Is. An execution refused for one ends with its error code
// (APPROVAL_CONSUMED, ...; DESIGN §7).
var (
	// ErrNotFound: no approval has the id (never created, or past the bucket's TTL).
	ErrNotFound = errors.New("capstan: no such approval")
	// ErrPending: the approval is not decided yet.
	ErrPending = errors.New("capstan: approval is pending")
	// ErrRejected: an approver rejected it.
	ErrRejected = errors.New("capstan: approval was rejected")
	// ErrCancelled: it was withdrawn before it was used.
	ErrCancelled = errors.New("capstan: approval was cancelled")
	// ErrExpired: its expiry passed before it was decided or used.
	ErrExpired = errors.New("capstan: approval expired")
	// ErrConsumed: another execution already used it.
	ErrConsumed = errors.New("capstan: approval already consumed")
	// ErrAlreadyDecided: a decision on an approval that is no longer pending.
	ErrAlreadyDecided = errors.New("capstan: approval already decided")
	// ErrSelfApproval: the requester approving their own call without a reason.
	ErrSelfApproval = errors.New("capstan: the requester cannot approve their own call")
	// ErrInputMismatch: the input is not the one approved.
	ErrInputMismatch = errors.New("capstan: input differs from the approved input")
	// ErrUnserializableInput: the input has no canonical JSON form to hash.
	ErrUnserializableInput = errors.New("capstan: input cannot be serialized canonically")
	// ErrInvalid: a malformed record or approver.
	ErrInvalid = errors.New("capstan: invalid approval")
	// ErrForbidden: the principal may not decide this approval (not an
	// approver, or not of its types).
	ErrForbidden = errors.New("capstan: not allowed to decide this approval")
	// ErrNoBucket: the approvals bucket is not open on the connection (a
	// producer's client, which may not write approvals).
	ErrNoBucket = errors.New("capstan: the approvals bucket is not open on this connection")
)
