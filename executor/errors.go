package executor

import "github.com/capstan-dev/capstan/envelope"

// Declared handler errors. A handler that returns one says code-level things
// to the runtime and the caller: its code (EXECUTION_FAILED unless set),
// whether another attempt may help, and a message the model may read. Any
// other error a handler returns is EXECUTION_FAILED, not retryable, and its
// wording never leaves the worker except in the logs.
//
//	if errors.Is(err, store.ErrConflict) {
//		return Out{}, executor.Retryable("The order is being changed; try again shortly.")
//	}
//	if refunded {
//		return Out{}, executor.Fail("The order was already refunded.", executor.WithCode("ALREADY_REFUNDED"))
//	}
//
// Retryable only permits a runtime retry; whether one happens is still the
// SI-11 rule of the capability's metadata.

// ErrorOption refines a declared error.
type ErrorOption func(*envelope.CapabilityError)

// Fail declares a failure another attempt would not cure: EXECUTION_FAILED,
// not retryable, message exposed to the model.
func Fail(message string, opts ...ErrorOption) *envelope.CapabilityError {
	return declared(message, false, opts)
}

// Retryable declares a failure another attempt may cure: EXECUTION_FAILED,
// retryable, message exposed to the model.
func Retryable(message string, opts ...ErrorOption) *envelope.CapabilityError {
	return declared(message, true, opts)
}

func declared(message string, retryable bool, opts []ErrorOption) *envelope.CapabilityError {
	e := &envelope.CapabilityError{Code: envelope.CodeExecutionFailed, Stage: envelope.StageHandler,
		Message: message, Retryable: retryable, ExposeToModel: true}
	for _, o := range opts {
		o(e)
	}
	return e
}

// WithCode sets an application code, such as "ALREADY_REFUNDED". The codes
// by which the runtime reports its own control of an execution (TIMEOUT,
// CANCELLED, OUTCOME_UNKNOWN, WORKER_LOST) are not a handler's to claim: a
// handler error carrying one is reported as EXECUTION_FAILED.
func WithCode(code envelope.Code) ErrorOption {
	return func(e *envelope.CapabilityError) { e.Code = code }
}

// WithCause keeps the underlying error for the logs and for errors.Is and
// errors.As; it is never sent.
func WithCause(err error) ErrorOption {
	return func(e *envelope.CapabilityError) { e.Cause = err }
}

// WithDetails attaches structured details to the envelope's error.
func WithDetails(details map[string]any) ErrorOption {
	return func(e *envelope.CapabilityError) { e.Details = details }
}

// Concealed keeps the message from the model: it sees INTERNAL_ERROR instead.
func Concealed() ErrorOption {
	return func(e *envelope.CapabilityError) { e.ExposeToModel = false }
}
