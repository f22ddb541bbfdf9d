package envelope

import "fmt"

// Code is a stable error code: codes are added, never repurposed.
type Code string

// Error codes of DESIGN §9.
const (
	CodeCapabilityNotFound          Code = "CAPABILITY_NOT_FOUND"
	CodeInputInvalid                Code = "INPUT_INVALID"
	CodeUnauthenticated             Code = "UNAUTHENTICATED"
	CodeForbidden                   Code = "FORBIDDEN"
	CodePolicyDenied                Code = "POLICY_DENIED"
	CodePolicyFailed                Code = "POLICY_FAILED"
	CodeApprovalPending             Code = "APPROVAL_PENDING"
	CodeApprovalRejected            Code = "APPROVAL_REJECTED"
	CodeApprovalExpired             Code = "APPROVAL_EXPIRED"
	CodeApprovalConsumed            Code = "APPROVAL_CONSUMED"
	CodeApprovalInputMismatch       Code = "APPROVAL_INPUT_MISMATCH"
	CodeApprovalSelfApproval        Code = "APPROVAL_SELF_APPROVAL"
	CodeApprovalUnserializableInput Code = "APPROVAL_UNSERIALIZABLE_INPUT"
	CodeExecutionFailed             Code = "EXECUTION_FAILED"
	CodeOutputInvalid               Code = "OUTPUT_INVALID"
	CodeTimeout                     Code = "TIMEOUT"
	CodeCancelled                   Code = "CANCELLED"
	CodeOutcomeUnknown              Code = "OUTCOME_UNKNOWN"
	CodeAuditUnavailable            Code = "AUDIT_UNAVAILABLE"
	CodeInternalError               Code = "INTERNAL_ERROR"
	// CodeNotStarted: no worker started the request by its start deadline; it
	// never ran.
	CodeNotStarted Code = "NOT_STARTED"
	// CodeRateLimited: a limit of the capability refused the call before it
	// started (DESIGN §17); details carry retryAfterMs and the limit.
	CodeRateLimited Code = "RATE_LIMITED"
	// CodeWorkerLost appears only as the previousErrorCode of a re-attempt after
	// a takeover, never on an envelope.
	CodeWorkerLost Code = "WORKER_LOST"
)

// Pipeline stage names carried on errors and audit events.
const (
	StageResolve     = "resolve"
	StageExposure    = "exposure"
	StageInput       = "input"
	StageActor       = "actor"
	StagePolicy      = "policy"
	StageApproval    = "approval"
	StageExecPolicy  = "execution-policy"
	StageControls    = "controls"
	StageHandler     = "handler"
	StageOutput      = "output"
	StageRedaction   = "redaction"
	StageFinalize    = "finalize"
	StageTimeout     = "timeout"
	StageCancelation = "cancellation"
	StageQueue       = "queue"
	StageLimits      = "limits"
)

// CapabilityError is the one error type of a governed failure. Message is the
// public message; Cause is private and never leaves the worker except in logs.
type CapabilityError struct {
	Code          Code
	Message       string
	Stage         string
	Retryable     bool
	ExposeToModel bool
	Details       map[string]any
	Cause         error
}

// Error is the code, the message and, for logs, the private cause.
func (e *CapabilityError) Error() string {
	if e.Cause != nil {
		return fmt.Sprintf("%s: %s: %v", e.Code, e.Message, e.Cause)
	}
	return fmt.Sprintf("%s: %s", e.Code, e.Message)
}

// Unwrap returns the private cause.
func (e *CapabilityError) Unwrap() error { return e.Cause }

// Wire returns the error's wire form (without the private cause).
func (e *CapabilityError) Wire() *Error {
	return &Error{
		Code:          e.Code,
		Message:       e.Message,
		Retryable:     e.Retryable,
		ExposeToModel: e.ExposeToModel,
		Details:       e.Details,
		Stage:         e.Stage,
	}
}

// ForModel is what a model may see of the error (see Error.ForModel): never
// the cause, and the message only when the error is exposed.
func (e *CapabilityError) ForModel() *ModelError { return e.Wire().ForModel() }

// Fail builds a CapabilityError exposed to the model with its message.
func Fail(code Code, stage, message string) *CapabilityError {
	return &CapabilityError{Code: code, Stage: stage, Message: message, ExposeToModel: true}
}
