package envelope

import (
	"fmt"
	"time"
)

// Actor is who an execution runs for.
type Actor struct {
	// ID names the actor within its kind (a user name, a service's name):
	// printable UTF-8, required for every kind but ActorAnonymous.
	ID string `json:"id"`
	// Kind is one of ActorUser, ActorService, ActorAgent or ActorAnonymous;
	// a worker refuses a call with any other, or none (UNAUTHENTICATED).
	Kind string `json:"kind"`
	// Attrs are attributes of the actor a policy may read (a tenant, a
	// role); nil for none. Written with their keys sorted.
	Attrs map[string]string `json:"attrs,omitempty"`
}

// String renders the actor as kind:id.
func (a Actor) String() string { return a.Kind + ":" + a.ID }

// Actor kinds.
const (
	ActorUser      = "user"
	ActorService   = "service"
	ActorAgent     = "agent"
	ActorAnonymous = "anonymous"
)

// Request is an execution request, published to
// capstan.exec.<principal>.<capabilityId> with the header Nats-Msg-Id naming
// its execution (see docs/wire.md, "Message ids"). A client builds it; a
// worker takes the principal from the subject, never from the request.
type Request struct {
	// V is the schema version, Version; a reader refuses any other.
	V int `json:"v"`
	// ExecutionID names the execution: 1 to 128 bytes of [A-Za-z0-9_-],
	// a new UUIDv7 unless the caller gave one. Unique per principal.
	ExecutionID string `json:"executionId"`
	// CapabilityID is the capability to run; empty only in a resume that
	// names its approval alone (ApprovalID), whose capability the workers
	// read from the approval.
	CapabilityID string `json:"capabilityId"`
	// Input is the call's input as a msgpack value; nil for none.
	Input Raw `json:"input,omitempty"`
	// Actor is who the execution runs for: the client's actor unless the
	// call names another.
	Actor Actor `json:"actor"`
	// Surface is where the call comes from ("direct", "mcp", "http"): the
	// client sets it from its configuration, whatever the caller passes.
	Surface string `json:"surface,omitempty"`
	// CorrelationID ties executions together (a conversation, a job) in the
	// audit trail; empty for none.
	CorrelationID string `json:"correlationId,omitempty"`
	// SubmittedAt is when the client made the request, in UTC.
	SubmittedAt time.Time `json:"submittedAt"`
	// Deadline, when set, ends the whole execution CANCELLED at that time,
	// across its attempts; nil for none (each attempt still has its
	// capability's timeout).
	Deadline *time.Time `json:"deadline,omitempty"`
	// StartBy is when a worker must have started the request; past it, the
	// request ends NOT_STARTED (DESIGN §13).
	StartBy *time.Time `json:"startBy,omitempty"`
	// ApprovalID, in a resume, is the granted approval the execution uses;
	// empty in a first call.
	ApprovalID string `json:"approvalId,omitempty"`
	// Traceparent is a W3C trace context the worker continues its spans
	// and audit events under; empty for none.
	Traceparent string `json:"traceparent,omitempty"`
}

// DecodeRequest decodes and checks an execution request. It never panics; every
// failure wraps ErrDecode.
func DecodeRequest(b []byte) (*Request, error) {
	r, err := decodeVersioned(b, decodeRequestFast, func(r *Request) int { return r.V })
	if err != nil {
		return nil, err
	}
	if err := ValidExecutionID(r.ExecutionID); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrDecode, err)
	}
	if r.CapabilityID == "" && r.ApprovalID == "" {
		// A resume may name only its approval: the workers read the rest.
		return nil, fmt.Errorf("%w: capabilityId is empty", ErrDecode)
	}
	return r, nil
}

// decodeVersioned decodes b as fast reads it, or with the reflective decoder
// what fast does not take, and refuses a schema version (version's) this
// build does not read.
func decodeVersioned[T any](b []byte, fast func([]byte) (T, bool), version func(*T) int) (*T, error) {
	v, ok := fast(b)
	if !ok {
		var zero T
		v = zero
		if err := Unmarshal(b, &v); err != nil {
			return nil, err
		}
	}
	if n := version(&v); n != Version {
		return nil, fmt.Errorf("%w: schema version %d, want %d", ErrDecode, n, Version)
	}
	return &v, nil
}

// Status is an envelope's outcome.
type Status string

// Envelope statuses.
const (
	StatusCompleted        Status = "completed"
	StatusFailed           Status = "failed"
	StatusCancelled        Status = "cancelled"
	StatusApprovalRequired Status = "approval-required"
)

// Error is the wire form of a governed failure.
type Error struct {
	// Code is the stable error code (DESIGN §9), e.g. CodeInputInvalid.
	Code Code `json:"code"`
	// Message is the public message: never the private cause.
	Message string `json:"message"`
	// Retryable says the same call may succeed if made again.
	Retryable bool `json:"retryable"`
	// ExposeToModel says Message may be shown to a model; when false a
	// model sees only a generic INTERNAL_ERROR (see ForModel).
	ExposeToModel bool `json:"exposeToModel"`
	// Details are structured facts of the failure: for INPUT_INVALID
	// {"issues": [{"message", "path"}]}, for RATE_LIMITED {"limit",
	// "retryAfterMs"}, for QUOTA_EXCEEDED {"quota", "limit",
	// "retryAfterMs"}, for other codes what the handler declared; nil for
	// none.
	Details map[string]any `json:"details,omitempty"`
	// Stage is the pipeline stage that ended the execution (one of the
	// Stage constants, e.g. StageHandler); empty when not known.
	Stage string `json:"stage,omitempty"`
}

// ApprovalRef tells the caller which approval an execution waits for.
type ApprovalRef struct {
	// ID is the approval's id: what an approver decides and a resume names.
	ID string `json:"id"`
	// Reasons say why the call needs an approval, in words an approver
	// reads (a policy's reason, the capability's approval rule).
	Reasons []string `json:"reasons,omitempty"`
	// Types are the approver types that may decide it (e.g. "finance").
	Types []string `json:"types,omitempty"`
	// ExpiresAt is when the approval expires if nobody decides it.
	ExpiresAt time.Time `json:"expiresAt"`
}

// Envelope is the one result of an execution, created once in the envelope
// bucket and never changed.
type Envelope struct {
	// V is the schema version, Version; a reader refuses any other.
	V int `json:"v"`
	// ExecutionID is the execution the envelope ends.
	ExecutionID string `json:"executionId"`
	// CapabilityID is the capability that ran; empty for a resume refused
	// before its approval was read.
	CapabilityID string `json:"capabilityId"`
	// Status is the outcome: completed, failed, cancelled or
	// approval-required.
	Status Status `json:"status"`
	// Output is the redacted output of a completed execution, as a msgpack
	// value; nil otherwise.
	Output Raw `json:"output,omitempty"`
	// Error says why a failed or cancelled execution ended; nil for a
	// completed one.
	Error *Error `json:"error,omitempty"`
	// Attempts is how many attempts of the handler were started, across
	// retries and workers; 0 when it never ran (refused, not started,
	// waiting for an approval).
	Attempts int `json:"attempts"`
	// Approval names the approval an approval-required execution waits
	// for; nil for every other status.
	Approval *ApprovalRef `json:"approval,omitempty"`
	// DurationMs is the time in milliseconds from when the finalizing
	// worker took the request up to when it wrote the envelope (time
	// queued, or spent by a worker that was lost, is not counted); 0 in an
	// envelope written without a delivery (by a sweep or a takeover).
	DurationMs int64 `json:"durationMs"`
	// FinalizedBy is the id of the worker that wrote the envelope
	// (executor.WorkerConfig.ID).
	FinalizedBy string `json:"finalizedBy,omitempty"`
	// FinalizedAt is when the envelope was written (the worker's clock,
	// UTC).
	FinalizedAt time.Time `json:"finalizedAt"`
	// Recovered is set when the outcome was not the handler's return but
	// recovered from the evidence a lost attempt left (DESIGN §5).
	Recovered *Recovered `json:"recovered,omitempty"`
}

// How an outcome was recovered.
const (
	// RecoveredByReceipt: from the receipt the attempt's handler recorded
	// after its effect, before its worker was lost or its attempt stopped.
	RecoveredByReceipt = "receipt"
	// RecoveredByReconciler: from what the capability's reconciler found
	// where the effect lives.
	RecoveredByReconciler = "reconciler"
)

// Recovered says how a completed outcome was recovered, and of which
// attempt: the attempt's handler did not return it (its worker was lost, or
// the attempt was stopped after its effect), but the effect is known to
// have happened.
type Recovered struct {
	// How is RecoveredByReceipt or RecoveredByReconciler.
	How string `json:"how"`
	// Attempt is the attempt (from 1) whose effect the outcome is.
	Attempt int `json:"attempt,omitempty"`
}

// ForModel is what a model is told of a recovered outcome, beside the
// output: that it is the operation's result although the call's worker did
// not report it, and how that is known. "" for none.
func (r *Recovered) ForModel() string {
	if r == nil {
		return ""
	}
	switch r.How {
	case RecoveredByReceipt:
		return fmt.Sprintf("The operation took effect (attempt %d). Its worker stopped before reporting the result; this result was recovered from the receipt the operation recorded when its effect happened. Do not call it again to make sure.", r.Attempt)
	case RecoveredByReconciler:
		return fmt.Sprintf("The operation took effect (attempt %d). Its worker was lost before reporting the result; this result was recovered by checking the system where the effect lives. Do not call it again to make sure.", r.Attempt)
	}
	return fmt.Sprintf("The operation took effect (attempt %d); its result was recovered (%s) after its worker stopped.", r.Attempt, r.How)
}

// DecodeEnvelope decodes an envelope record.
func DecodeEnvelope(b []byte) (*Envelope, error) {
	return decodeVersioned(b, decodeEnvelopeFast, func(e *Envelope) int { return e.V })
}

// ModelError is the only shape of a failure a model may see.
type ModelError struct {
	Code      Code           `json:"code"`              // the error's code, or CodeInternalError when it is not exposed
	Message   string         `json:"message"`           // the public message, or a generic one when it is not exposed
	Retryable bool           `json:"retryable"`         // the same call may succeed if made again
	Details   map[string]any `json:"details,omitempty"` // only for INPUT_INVALID, RATE_LIMITED and QUOTA_EXCEEDED; nil otherwise
}

// ForModel returns what a model may see of the envelope's error: the code,
// message and retryability when the error is exposed, a generic internal error
// otherwise. Details travel only with INPUT_INVALID (the issues),
// RATE_LIMITED (retryAfterMs and the limit) and QUOTA_EXCEEDED (the quota). It is nil for an envelope without
// an error.
func (e *Envelope) ForModel() *ModelError {
	if e == nil || e.Error == nil {
		return nil
	}
	return e.Error.ForModel()
}

// ForModel is the model-safe view of one error.
func (e *Error) ForModel() *ModelError {
	if !e.ExposeToModel {
		return &ModelError{Code: CodeInternalError, Message: "The operation failed.", Retryable: false}
	}
	m := &ModelError{Code: e.Code, Message: e.Message, Retryable: e.Retryable}
	if e.Code == CodeInputInvalid || e.Code == CodeRateLimited || e.Code == CodeQuotaExceeded {
		m.Details = e.Details
	}
	return m
}
