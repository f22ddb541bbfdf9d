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
	// CodePaused: an operator paused what the call does (DESIGN §18), and
	// the pause refuses calls rather than hold them; the message carries the
	// operator's reason. Retryable: the call runs once the pause is lifted.
	CodePaused Code = "PAUSED"
	// CodeQuotaExceeded: the calling principal is over one of its quotas
	// (DESIGN §12 "Quotas"); details carry which quota, its limit and, when
	// waiting helps, retryAfterMs. Refused before anything ran.
	CodeQuotaExceeded Code = "QUOTA_EXCEEDED"
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
	// Code is the stable error code (DESIGN §9), e.g. CodeInputInvalid.
	Code Code
	// Message is the public message, written to the envelope; a model sees
	// it only when ExposeToModel is set.
	Message string
	// Stage is the pipeline stage that failed (a Stage constant); the worker
	// sets StageHandler on any error a handler returns.
	Stage string
	// Retryable says the same call may succeed if made again. On a
	// handler's error it permits a runtime retry, which happens only when
	// the capability's metadata allows one (retries configured, and a
	// read, or a write declared idempotent).
	Retryable bool
	// ExposeToModel lets a model see Message (and the code); when false a
	// model sees only a generic INTERNAL_ERROR.
	ExposeToModel bool
	// Details are structured facts of the failure, written to the
	// envelope's error; nil for none. A model sees them only with
	// INPUT_INVALID, RATE_LIMITED and QUOTA_EXCEEDED.
	Details map[string]any
	// Cause is the private cause: kept in logs and the execution's record
	// for operators, never in the envelope or shown to a model.
	Cause error
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

// Is reports whether the error is the condition target names: a
// QUOTA_EXCEEDED error is ErrQuotaExceeded.
func (e *CapabilityError) Is(target error) bool {
	return target == ErrQuotaExceeded && e.Code == CodeQuotaExceeded
}

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
