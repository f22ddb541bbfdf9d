package envelope

import (
	"fmt"
	"time"
)

// Actor is who an execution runs for.
type Actor struct {
	ID    string            `json:"id"`
	Kind  string            `json:"kind"`
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

// Request is an execution request, published to capstan.exec.<capabilityId>
// with the header Nats-Msg-Id set to ExecutionID.
type Request struct {
	V             int        `json:"v"`
	ExecutionID   string     `json:"executionId"`
	CapabilityID  string     `json:"capabilityId"`
	Input         Raw        `json:"input,omitempty"`
	Actor         Actor      `json:"actor"`
	Surface       string     `json:"surface,omitempty"`
	CorrelationID string     `json:"correlationId,omitempty"`
	SubmittedAt   time.Time  `json:"submittedAt"`
	Deadline      *time.Time `json:"deadline,omitempty"`
	// StartBy is when a worker must have started the request; past it, the
	// request ends NOT_STARTED (DESIGN §13).
	StartBy     *time.Time `json:"startBy,omitempty"`
	ApprovalID  string     `json:"approvalId,omitempty"`
	Traceparent string     `json:"traceparent,omitempty"`
}

// DecodeRequest decodes and checks an execution request. It never panics; every
// failure wraps ErrDecode.
func DecodeRequest(b []byte) (*Request, error) {
	r, ok := decodeRequestFast(b)
	if !ok {
		r = Request{}
		if err := Unmarshal(b, &r); err != nil {
			return nil, err
		}
	}
	if r.V != Version {
		return nil, fmt.Errorf("%w: schema version %d, want %d", ErrDecode, r.V, Version)
	}
	if err := ValidExecutionID(r.ExecutionID); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrDecode, err)
	}
	if r.CapabilityID == "" && r.ApprovalID == "" {
		// A resume may name only its approval: the workers read the rest.
		return nil, fmt.Errorf("%w: capabilityId is empty", ErrDecode)
	}
	return &r, nil
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
	Code          Code           `json:"code"`
	Message       string         `json:"message"`
	Retryable     bool           `json:"retryable"`
	ExposeToModel bool           `json:"exposeToModel"`
	Details       map[string]any `json:"details,omitempty"`
	Stage         string         `json:"stage,omitempty"`
}

// ApprovalRef tells the caller which approval an execution waits for.
type ApprovalRef struct {
	ID        string    `json:"id"`
	Reasons   []string  `json:"reasons,omitempty"`
	Types     []string  `json:"types,omitempty"`
	ExpiresAt time.Time `json:"expiresAt"`
}

// Envelope is the one result of an execution, created once in the envelope
// bucket and never changed.
type Envelope struct {
	V            int          `json:"v"`
	ExecutionID  string       `json:"executionId"`
	CapabilityID string       `json:"capabilityId"`
	Status       Status       `json:"status"`
	Output       Raw          `json:"output,omitempty"`
	Error        *Error       `json:"error,omitempty"`
	Attempts     int          `json:"attempts"`
	Approval     *ApprovalRef `json:"approval,omitempty"`
	DurationMs   int64        `json:"durationMs"`
	FinalizedBy  string       `json:"finalizedBy,omitempty"`
	FinalizedAt  time.Time    `json:"finalizedAt"`
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
	How     string `json:"how"`
	Attempt int    `json:"attempt,omitempty"`
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
	var e Envelope
	if err := Unmarshal(b, &e); err != nil {
		return nil, err
	}
	if e.V != Version {
		return nil, fmt.Errorf("%w: schema version %d, want %d", ErrDecode, e.V, Version)
	}
	return &e, nil
}

// ModelError is the only shape of a failure a model may see.
type ModelError struct {
	Code      Code           `json:"code"`
	Message   string         `json:"message"`
	Retryable bool           `json:"retryable"`
	Details   map[string]any `json:"details,omitempty"`
}

// ForModel returns what a model may see of the envelope's error: the code,
// message and retryability when the error is exposed, a generic internal error
// otherwise. Details travel only with INPUT_INVALID (the issues) and
// RATE_LIMITED (retryAfterMs and the limit). It is nil for an envelope without
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
	if e.Code == CodeInputInvalid || e.Code == CodeRateLimited {
		m.Details = e.Details
	}
	return m
}
