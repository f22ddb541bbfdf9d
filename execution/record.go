package execution

import (
	"time"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/msgenc"
	"github.com/vmihailenco/msgpack/v5"
)

// State is an execution record's state (DESIGN §5).
type State string

// Record states.
const (
	// StatePending: a cancel arrived before any worker claimed the execution.
	StatePending State = "pending"
	// StateClaimed: a worker claimed it; no attempt has started.
	StateClaimed State = "claimed"
	// StateRunning: attempt Attempt runs, under the claim's lease.
	StateRunning State = "running"
	// StateBackoff: attempt Attempt failed retryably; the next waits.
	StateBackoff State = "backoff"
	// StateFinalized: the execution ended; its envelope holds the outcome.
	// A record may also still say running beside its envelope, which is the
	// proof of the end (Client.Status reads them together).
	StateFinalized State = "finalized"
	// StateReconciling: a takeover asks the capability's reconciler whether
	// the lost attempt (Attempt) took effect, under its claim and lease as an
	// attempt runs (DESIGN §5, receipts and reconcilers).
	StateReconciling State = "reconciling"
)

// Record is an execution's one record in the executions bucket, changed only
// by compare-and-swap on its revision. The claim named in it owns the
// execution while its lease lasts: a random token each claim or takeover
// draws, never the worker's id, which two processes may share.
type Record struct {
	// V is the record's schema version.
	V int `json:"v"`
	// ExecutionID and CapabilityID name the execution and what it calls.
	ExecutionID  string `json:"executionId"`
	CapabilityID string `json:"capabilityId"` // the capability the request names
	// State is where the execution is.
	State State `json:"state"`
	// Attempt is the number of the attempt running, or the last one started.
	Attempt int `json:"attempt"`
	// Worker is the id of the worker holding the claim.
	Worker string `json:"worker,omitempty"`
	// Claim is the owning claim's random token.
	Claim string `json:"claim,omitempty"`
	// LeaseUntil is when the claim lapses unless renewed: another worker
	// may then take the execution over.
	LeaseUntil time.Time `json:"leaseUntil,omitzero"`
	// StartedAt is when the current attempt started.
	StartedAt time.Time `json:"startedAt,omitzero"`
	// LastError is the failed attempt's code in backoff, the envelope's
	// code once finalized, and WORKER_LOST on a claim made where finding no
	// record did not prove that no attempt had started: its takeover never
	// runs it from the top unless a retry is allowed (DESIGN §5).
	LastError envelope.Code `json:"lastError,omitempty"`
	// CancelRequested may be set in any state before finalized; it is terminal.
	CancelRequested bool `json:"cancelRequested,omitempty"`
	// CancelRequestedAt is when the cancel arrived.
	CancelRequestedAt time.Time `json:"cancelRequestedAt,omitzero"`
	// ApprovalID is the approval the execution resumes, if any; while it is
	// claimed, it may instead be the approval it asked for, its id reserved
	// before the approval is stored, so that a takeover asks no second one.
	ApprovalID string `json:"approvalId,omitempty"`
	// Actor (kind:id), Surface and InputHash, with CapabilityID and
	// ApprovalID, name the request the record was claimed for: only that
	// request takes the execution over. Records written before they existed
	// lack them.
	Actor     string `json:"actor,omitempty"`
	Surface   string `json:"surface,omitempty"`   // the request's surface ("direct", "mcp", "http")
	InputHash string `json:"inputHash,omitempty"` // envelope.InputHash of the request's input
	// Status is the envelope's status once finalized.
	Status envelope.Status `json:"status,omitempty"`
	// Cause is a failure's private cause, for operators: it never reaches the
	// envelope, the model or the audit trail.
	Cause string `json:"cause,omitempty"`
	// CreatedAt and UpdatedAt are when the record was created and last
	// written.
	CreatedAt time.Time `json:"createdAt"`
	UpdatedAt time.Time `json:"updatedAt"` // see CreatedAt

	// Receipts and reconcilers (DESIGN §5). Receipt is the evidence attempt
	// ReceiptAttempt recorded of its effect, at ReceiptAt, written by that
	// attempt's claim (a lost lease cannot write it): a takeover of the
	// attempt finalizes completed from it. A new attempt clears it.
	Receipt        envelope.Raw `json:"receipt,omitempty"`
	ReceiptAttempt int          `json:"receiptAttempt,omitempty"` // the attempt that recorded Receipt
	ReceiptAt      time.Time    `json:"receiptAt,omitzero"`       // when Receipt was recorded
	// Reconciliations counts the reconciliations started for Attempt: those
	// lost with their workers are bounded.
	Reconciliations int `json:"reconciliations,omitempty"`
	// Reattempts counts the attempts started because a reconciler proved the
	// effect of the one before absent: bounded by the capability.
	Reattempts int `json:"reattempts,omitempty"`

	// Progress is the last progress the running attempt's handler reported,
	// as of the last lease renewal (DESIGN §5, "Progress"): written with
	// the renewal, never on its own; cleared when an attempt starts.
	Progress *envelope.Progress `json:"progress,omitempty"`

	// KeyVersion is the derivation of the idempotency key every attempt
	// and reconciliation of the execution is given (envelope.IdempotencyKeyOf),
	// fixed when the record is created: a record written before it existed
	// (0) is of an execution begun by an earlier version, which keeps the
	// key of the id alone until it ends (DESIGN §6).
	KeyVersion int `json:"keyVersion,omitempty"`
}

// IdempotencyKey is the key the execution's attempts are given, principal
// being its owner: the derivation the record names.
func (r *Record) IdempotencyKey(principal string) string {
	return envelope.IdempotencyKeyOf(r.KeyVersion, principal, r.ExecutionID)
}

// InFlight reports whether the record is of an execution that may still
// write its envelope: not finalized, and waiting for its first claim (a
// cancel's pending record) or held by a live lease. A record is not
// rewritten after its envelope (DESIGN §14): one whose lease ran out says
// nothing more of its outcome.
func (r *Record) InFlight(now time.Time) bool {
	switch r.State {
	case StateFinalized:
		return false
	case StatePending:
		return true
	}
	return now.Before(r.LeaseUntil)
}

// Leased reports whether a claim holds the record under a lease that has
// not run out at now (a cancel's pending record names no claim).
func (r *Record) Leased(now time.Time) bool {
	return (r.Worker != "" || r.Claim != "") && now.Before(r.LeaseUntil)
}

// EncodeMsgpack writes the record without reflection: it is written three
// times per execution. A field added to Record is added here too, in
// declaration order (TestRecordEncoder_WritesTheReflectiveEncodersBytes
// fails until it is).
func (r Record) EncodeMsgpack(enc *msgpack.Encoder) error {
	var f msgenc.Fields
	f.Int("v", int64(r.V))
	f.String("executionId", r.ExecutionID)
	f.String("capabilityId", r.CapabilityID)
	f.String("state", string(r.State))
	f.Int("attempt", int64(r.Attempt))
	f.String("worker", r.Worker)
	f.String("claim", r.Claim)
	f.Time("leaseUntil", r.LeaseUntil)
	f.Time("startedAt", r.StartedAt)
	f.String("lastError", string(r.LastError))
	f.Bool("cancelRequested", r.CancelRequested)
	f.Time("cancelRequestedAt", r.CancelRequestedAt)
	f.String("approvalId", r.ApprovalID)
	f.String("actor", r.Actor)
	f.String("surface", r.Surface)
	f.String("inputHash", r.InputHash)
	f.String("status", string(r.Status))
	f.String("cause", r.Cause)
	f.Time("createdAt", r.CreatedAt)
	f.Time("updatedAt", r.UpdatedAt)
	f.Raw("receipt", r.Receipt)
	f.Int("receiptAttempt", int64(r.ReceiptAttempt))
	f.Time("receiptAt", r.ReceiptAt)
	f.Int("reconciliations", int64(r.Reconciliations))
	f.Int("reattempts", int64(r.Reattempts))
	f.Value("progress", r.Progress, r.Progress == nil)
	f.Int("keyVersion", int64(r.KeyVersion))
	return f.Encode(enc)
}
