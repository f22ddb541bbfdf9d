package approvalstore

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/canonjson"
)

// DefaultTTL is how long an approval stays decidable and, once approved,
// consumable, unless the capability says otherwise.
const DefaultTTL = 15 * time.Minute

// Canonical returns an input's canonical JSON (sorted keys, no insignificant
// whitespace, UTF-8) and its hex SHA-256. An input without a canonical form
// (NaN, infinities, byte strings, invalid UTF-8) fails
// approvals.ErrUnserializableInput.
func Canonical(input envelope.Raw) (json.RawMessage, string, error) {
	v, err := input.Value()
	if err != nil {
		return nil, "", fmt.Errorf("%w: %v", approvals.ErrUnserializableInput, err)
	}
	c, err := canonjson.Marshal(v)
	if err != nil {
		return nil, "", fmt.Errorf("%w: %v", approvals.ErrUnserializableInput, err)
	}
	sum := sha256.Sum256(c)
	return c, hex.EncodeToString(sum[:]), nil
}

// Code is the error code of an approval's condition (DESIGN §7), or "" when
// err is none of them.
func Code(err error) envelope.Code {
	for _, m := range []struct {
		err  error
		code envelope.Code
	}{
		{approvals.ErrSelfApproval, envelope.CodeApprovalSelfApproval},
		{approvals.ErrInputMismatch, envelope.CodeApprovalInputMismatch},
		{approvals.ErrUnserializableInput, envelope.CodeApprovalUnserializableInput},
		{approvals.ErrConsumed, envelope.CodeApprovalConsumed},
		{approvals.ErrExpired, envelope.CodeApprovalExpired},
		{approvals.ErrRejected, envelope.CodeApprovalRejected},
		{approvals.ErrCancelled, envelope.CodeApprovalRejected},
		{approvals.ErrPending, envelope.CodeApprovalPending},
		{approvals.ErrForbidden, envelope.CodeForbidden},
		{approvals.ErrAlreadyDecided, envelope.CodeForbidden},
		{approvals.ErrNotFound, envelope.CodeForbidden},
		{approvals.ErrInvalid, envelope.CodeForbidden},
	} {
		if errors.Is(err, m.err) {
			return m.code
		}
	}
	return ""
}

// Usable reports why the approval r cannot authorize executionID, whose
// execution record was created at under, at t, or nil when it can: approved
// and unexpired, or already consumed by executionID under that same record
// (a takeover or redelivery of the execution it authorized, still in flight).
// Consumed under another record, or under none known (a zero under), it is
// spent (approvals.ErrConsumed): the approval's record is the proof of use.
func Usable(r *approvals.Record, executionID string, under, t time.Time) error {
	return statusError(r.StatusAt(t), r, executionID, under)
}

// statusError is the condition of a record that cannot be used, or nil for
// an approved one. A record consumed by executionID under the execution
// record created at under counts as usable: a takeover or redelivery of the
// execution it authorized, still in flight. Consumed under another record
// (the first one's expired) it is spent, as for any other execution.
func statusError(s approvals.Status, r *approvals.Record, executionID string, under time.Time) error {
	switch s {
	case approvals.StatusApproved:
		return nil
	case approvals.StatusConsumed:
		if consumedUnder(r, executionID, under) {
			return nil
		}
		if executionID != "" && r.ConsumedBy == executionID {
			return fmt.Errorf("%w: by this execution, under a record created %s (this one: %s)", approvals.ErrConsumed,
				r.ConsumedUnder.Format(time.RFC3339Nano), under.Format(time.RFC3339Nano))
		}
		return approvals.ErrConsumed
	case approvals.StatusPending:
		return approvals.ErrPending
	case approvals.StatusRejected:
		return approvals.ErrRejected
	case approvals.StatusCancelled:
		return approvals.ErrCancelled
	case approvals.StatusExpired:
		return approvals.ErrExpired
	}
	return approvals.ErrInvalid
}

// consumedUnder reports whether r was consumed by executionID under the
// execution record created at under.
func consumedUnder(r *approvals.Record, executionID string, under time.Time) bool {
	return r.Status == approvals.StatusConsumed && executionID != "" && r.ConsumedBy == executionID &&
		!under.IsZero() && r.ConsumedUnder.Equal(under)
}

func sameActor(a, b envelope.Actor) bool { return a.Kind == b.Kind && a.ID == b.ID }

func checkApprover(a envelope.Actor) error {
	switch a.Kind {
	case envelope.ActorUser, envelope.ActorService, envelope.ActorAgent:
		if a.ID != "" {
			return nil
		}
	}
	return fmt.Errorf("%w: the approver must be a user, service or agent with an id, not %q", approvals.ErrInvalid, a.String())
}

// notFound is the refusal of an approval id that names nothing the asker
// may see: the same, word for word, whether the approval does not exist or
// is another's.
func notFound(id string) error { return fmt.Errorf("%w: %s", approvals.ErrNotFound, id) }
