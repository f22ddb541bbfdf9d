package approvals

import (
	"errors"
	"fmt"
	"time"

	"github.com/capstan-dev/capstan/envelope"
)

// Sentinel conditions of the store. Compare with errors.Is; Code maps them to
// the error codes of DESIGN §7.
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
)

// Code is the error code of a store error, or "" when err is none of the
// approval conditions.
func Code(err error) envelope.Code {
	for _, m := range []struct {
		err  error
		code envelope.Code
	}{
		{ErrSelfApproval, envelope.CodeApprovalSelfApproval},
		{ErrInputMismatch, envelope.CodeApprovalInputMismatch},
		{ErrUnserializableInput, envelope.CodeApprovalUnserializableInput},
		{ErrConsumed, envelope.CodeApprovalConsumed},
		{ErrExpired, envelope.CodeApprovalExpired},
		{ErrRejected, envelope.CodeApprovalRejected},
		{ErrCancelled, envelope.CodeApprovalRejected},
		{ErrPending, envelope.CodeApprovalPending},
		{ErrForbidden, envelope.CodeForbidden},
		{ErrAlreadyDecided, envelope.CodeForbidden},
		{ErrNotFound, envelope.CodeForbidden},
		{ErrInvalid, envelope.CodeForbidden},
	} {
		if errors.Is(err, m.err) {
			return m.code
		}
	}
	return ""
}

// statusError is the condition of a record that cannot be used, or nil for
// an approved one. A record consumed by executionID under the execution
// record created at under counts as usable: a takeover or redelivery of the
// execution it authorized, still in flight. Consumed under another record
// (the first one's expired) it is spent, as for any other execution.
func statusError(s Status, r *Record, executionID string, under time.Time) error {
	switch s {
	case StatusApproved:
		return nil
	case StatusConsumed:
		if r.consumedUnder(executionID, under) {
			return nil
		}
		if executionID != "" && r.ConsumedBy == executionID {
			return fmt.Errorf("%w: by this execution, under a record created %s (this one: %s)", ErrConsumed,
				r.ConsumedUnder.Format(time.RFC3339Nano), under.Format(time.RFC3339Nano))
		}
		return ErrConsumed
	case StatusPending:
		return ErrPending
	case StatusRejected:
		return ErrRejected
	case StatusCancelled:
		return ErrCancelled
	case StatusExpired:
		return ErrExpired
	}
	return ErrInvalid
}
