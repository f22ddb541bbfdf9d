package engine

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
)

// What a handler returns is classified at the handler stage: the codes the
// runtime alone asserts (a timeout, a cancel, a lost worker, an unknown
// outcome) are never a handler's to claim, and become EXECUTION_FAILED.
func TestHandlerError_RuntimeCodesAreNeverTheHandlers(t *testing.T) {
	t.Parallel()
	for _, code := range []envelope.Code{envelope.CodeTimeout, envelope.CodeCancelled, envelope.CodeOutcomeUnknown,
		envelope.CodeWorkerLost, ""} {
		got := handlerError(fmt.Errorf("wrapped: %w", &envelope.CapabilityError{Code: code, Message: "mine"}))
		if got.Code != envelope.CodeExecutionFailed || got.Stage != envelope.StageHandler {
			t.Errorf("a handler's %q: code %s at %s, want EXECUTION_FAILED at the handler", code, got.Code, got.Stage)
		}
	}
	declared := &envelope.CapabilityError{Code: envelope.CodeRateLimited, Message: "slow down", Retryable: true}
	if got := handlerError(declared); got.Code != envelope.CodeRateLimited || got.Message != "slow down" || !got.Retryable {
		t.Errorf("a declared error: %+v, want its own code, message and retryability", got)
	}
}

// A handler's error is retryable only where it says so: an error it did not
// declare, or one declared not retryable, is not; and the handler's value
// itself is never changed (it may be a shared sentinel).
func TestHandlerError_RetryableOnlyAsDeclared(t *testing.T) {
	t.Parallel()
	if got := handlerError(errors.New("boom")); got.Retryable || got.Code != envelope.CodeExecutionFailed {
		t.Errorf("an undeclared error: %+v, want EXECUTION_FAILED, not retryable", got)
	}
	sentinel := &envelope.CapabilityError{Code: envelope.CodePolicyDenied, Message: "taken"}
	if got := handlerError(sentinel); got.Retryable {
		t.Errorf("an error declared not retryable came out retryable: %+v", got)
	}
	if sentinel.Stage != "" || sentinel.Cause != nil || sentinel.Retryable {
		t.Errorf("the handler's own error was changed: %+v", sentinel)
	}
}

// A last attempt that timed out is the runtime stopping it, as a cancel is:
// status cancelled, code TIMEOUT, event capability.cancelled. A failure the
// handler reported is status failed, event capability.failed, its effect
// possibly done.
func TestAfterRun_LastTimeoutEndsCancelledTimeout(t *testing.T) {
	t.Parallel()
	o := afterRun(timeoutError(5 * time.Second))
	if o.env.Status != envelope.StatusCancelled || o.env.Error.Code != envelope.CodeTimeout || o.event != audit.EventCancelled {
		t.Errorf("a last timeout: %s %s %s, want cancelled TIMEOUT capability.cancelled", o.env.Status, o.env.Error.Code, o.event)
	}
	o = afterRun(handlerError(errors.New("boom")))
	if o.env.Status != envelope.StatusFailed || o.event != audit.EventFailed || o.data["executedBeforeFailure"] != true {
		t.Errorf("a handler's failure: %s %s %v, want failed, capability.failed, executed", o.env.Status, o.event, o.data)
	}
}

// An execution runs once per worker: the table of executions in flight
// refuses a second entry of a key it holds, and keeps the first one's.
func TestInflight_OneRunPerExecution(t *testing.T) {
	t.Parallel()
	var tbl inflight
	tbl.m = map[string]*flight{}
	firstEnded := false
	first := &flight{cancel: func(error) { firstEnded = true }}
	if !tbl.add("k", first) {
		t.Fatal("the first run refused")
	}
	if tbl.add("k", &flight{cancel: func(error) {}}) {
		t.Fatal("a second run of the same execution admitted")
	}
	if !tbl.add("other", &flight{cancel: func(error) {}}) {
		t.Fatal("another execution refused")
	}
	tbl.get("k")(nil)
	if !firstEnded || tbl.len() != 2 {
		t.Fatalf("the table lost the first run (ended %v, %d in flight)", firstEnded, tbl.len())
	}
}
