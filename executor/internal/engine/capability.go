package engine

import (
	"context"
	"log/slog"
	"time"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/observe"
)

// The seam between the public executor package and the engine, one way
// down: the engine hands a capability the request, values only, and gets a
// decision back — admitted with what to run, refused with which error, or in
// need of an approval. A capability never calls into the engine: the engine
// alone claims, writes records, files the trail and writes envelopes, and it
// carries out what a decision asks (the events it lists, the approval it
// needs stored).

// Definition is what the engine needs of the capability a request names:
// the stages its definition decides (exposure, input, actor, policies,
// approval, output) and its retry rule. The executor package provides it.
type Definition interface {
	// Admit runs stages 4 to 9 of a fresh execution. ctx is the execution's:
	// its cancel and deadline. A request that names an approval (a resume)
	// is always admitted under the execution's claim, so that consuming the
	// approval is this execution's to do.
	Admit(ctx context.Context, r Request) Admission
	// Readmit restores what Admit established, for a takeover of an
	// execution whose attempts had started: the input, and the approval it
	// consumed.
	Readmit(ctx context.Context, r Request) Admission
	// Timeout bounds one attempt.
	Timeout() time.Duration
	// Retry is the retry rule (SI-11, DESIGN §6): whether attempt n, which
	// failed with err, may be followed by attempt n+1, and after what pause.
	Retry(n int, err *envelope.CapabilityError) (backoff time.Duration, ok bool)
}

// Request is what the stages see of one execution.
type Request struct {
	*envelope.Request
	// Principal is who sent it: the token of the subject the NATS server
	// let it be published on, never a field of the body.
	Principal string
	// SubjectCapability is the capability id of that subject ("" when it
	// came through _unrouted): a body naming another is refused.
	SubjectCapability string
	// Observer is told of the stages that wait on I/O (Stage, with the
	// execution's context and an observe.Stage* name); nil: none.
	Observer observe.Execution
}

// Admission is the stages' decision on one execution: exactly one of Unit,
// Refusal, Approval and Stopped.
type Admission struct {
	// Events are the audit events the stages want on the trail (a denial
	// and its reason, an approval consumed), in order; the engine files them
	// before it acts on the rest.
	Events []Event
	// Unit admits the execution: the engine runs its attempts.
	Unit WorkUnit
	// Refusal ends the execution before any attempt.
	Refusal *envelope.CapabilityError
	// Approval is stage 8's need of an approval.
	Approval *ApprovalNeeded
	// Stopped: the execution's context ended while the stages ran (a
	// policy cut off by a cancel, the deadline, a lost claim, a shutdown):
	// the engine ends it as the context says.
	Stopped bool
}

// Event is an audit event the stages file: its type and data; the engine
// adds the execution's identity.
type Event struct {
	Type string
	Data map[string]any
}

// ApprovalNeeded is a call that waits for a human decision (stage 8). The
// engine claims the execution, reserves the approval's id on its record (a
// takeover finds the same id and never asks twice), calls Store with it,
// and ends the execution approval-required with what Store returns, or
// failed with its error.
type ApprovalNeeded struct {
	// Store stores the pending approval under id, unless it is stored
	// already for this execution, and returns its reference for the
	// envelope and the data of capability.approval_requested.
	Store func(ctx context.Context, id string) (*envelope.ApprovalRef, map[string]any, *envelope.CapabilityError)
}

// WorkUnit is an admitted execution: what its attempts run, as River's
// WorkUnit is a job's work. Values in, values out.
type WorkUnit interface {
	// Started is the data of attempt n's capability.started event.
	Started(n int) map[string]any
	// Work calls the handler once, for attempt a, under ctx (the attempt's
	// timeout, the execution's cancel).
	Work(ctx context.Context, a Attempt) (any, error)
	// Output is stages 12 and 13: validation, redaction, encoding of what
	// an attempt returned. Nothing of an output that fails them leaves the
	// worker.
	Output(out any) (envelope.Raw, *envelope.CapabilityError)
}

// Attempt is one call of a handler.
type Attempt struct {
	// N counts from 1; takeovers after a lost worker count too.
	N      int
	Logger *slog.Logger
}
