package engine

import (
	"context"
	"log/slog"
	"time"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/limits"
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
	// execution whose attempts had started: the input, the approval it
	// consumed, and its concurrency limits (the rest the engine does not
	// take again, so they need not be computed).
	Readmit(ctx context.Context, r Request) Admission
	// Timeout bounds one attempt.
	Timeout() time.Duration
	// Retry is the retry rule (SI-11, DESIGN §6): whether attempt n, which
	// failed with err, may be followed by attempt n+1, and after what pause.
	Retry(n int, err *envelope.CapabilityError) (backoff time.Duration, ok bool)
	// Recovery is what the capability declares for an attempt whose
	// outcome was lost: its reconciler, if any (DESIGN §5).
	Recovery() Recovery
	// Rerunnable: running it twice is harmless (a read, or a write declared
	// idempotent). A timed-out attempt of other work may have taken effect,
	// and its envelope tells the caller not to simply call again.
	Rerunnable() bool
	// Unclaimed: a read whose runs need no claim (DESIGN §4, "Reads without
	// claims"): no record is written for it, and a run lost with its worker
	// runs again; the envelope's create-only write alone decides its end.
	Unclaimed() bool
}

// Recovery is what a capability declares for an attempt whose outcome was
// lost with its worker (DESIGN §5, receipts and reconcilers). The zero
// value declares no reconciler: a lost attempt that left no receipt is
// decided as it always was.
type Recovery struct {
	// Reconciles: the capability has a reconciler (WorkUnit.Reconcile).
	Reconciles bool
	// ProvesAbsence: its reconciler's Absent is authoritative — the system
	// where the effect lives says it did not happen, and folds any late
	// effect of the lost attempt into a new one under the same idempotency
	// key. Only then may a new attempt of work that is not retried run.
	ProvesAbsence bool
	// MaxReattempts bounds the attempts a proof of absence may start.
	MaxReattempts int
	// Timeout bounds one reconciliation.
	Timeout time.Duration
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
	// RecordCreated is when the execution record this delivery holds was
	// created (zero before the claim: the short path). It names the record:
	// an approval consumed under it may be used again by a delivery holding
	// the same record, never under one made since (DESIGN §7).
	RecordCreated time.Time
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
	// Limits are the limits an admitted execution takes before its first
	// attempt (DESIGN §17), resolved for its actor, principal and input.
	// None: nothing is read or written for limits.
	Limits []limits.Limit
	// OverBudget, when set, is the approval a budget whose choice is an
	// approval asks for when the execution is over it (reason says which).
	OverBudget func(reason string) *ApprovalNeeded
	// Approved: the execution consumed an approval, which lets it past a
	// budget whose choice at its limit is an approval.
	Approved bool
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
	// Started is the data of attempt n's capability.started event: a map
	// of its own, which the engine may add to.
	Started(n int) map[string]any
	// Work calls the handler once, for attempt a, under ctx (the attempt's
	// timeout, the execution's cancel).
	Work(ctx context.Context, a Attempt) (any, error)
	// Output is stages 12 and 13: validation, redaction, encoding of what
	// an attempt returned. Nothing of an output that fails them leaves the
	// worker.
	Output(out any) (envelope.Raw, *envelope.CapabilityError)
	// FromReceipt is the output attempt n's receipt stands for, before
	// stages 12 and 13 (the receipt itself, or what the capability makes of
	// it).
	FromReceipt(ctx context.Context, n int, receipt envelope.Raw) (any, error)
	// Reconcile asks the capability's reconciler whether attempt n, which
	// was given the idempotency key key, took effect, under ctx (the
	// reconciliation's timeout; not the execution's cancel, which stops
	// nothing of a lost attempt). Only called when Recovery().Reconciles.
	Reconcile(ctx context.Context, n int, key string) Reconciliation
	// Recheck decides a retry again by the rules an operator may change
	// while the execution runs (the policy set in force, DESIGN §18): the
	// events to file, and the refusal that ends the execution instead of
	// the retry (nil: it may run).
	Recheck() ([]Event, *envelope.CapabilityError)
}

// Verdict is a reconciler's answer, as the takeover table reads it.
type Verdict int

// Reconcilers' answers.
const (
	// NotAsked: no reconciler was asked about the attempt (yet).
	NotAsked Verdict = iota
	// Found: the effect happened; Reconciliation.Output is the output.
	Found
	// Absent: the effect did not happen (authoritative only where the
	// capability declares Recovery.ProvesAbsence).
	Absent
	// Inconclusive: the reconciler could not tell (it said so, failed,
	// panicked or ran out of time).
	Inconclusive
)

var verdictNames = [...]string{"not-asked", "found", "absent", "unknown"}

// String names the verdict as the trail does.
func (v Verdict) String() string {
	if v >= 0 && int(v) < len(verdictNames) {
		return verdictNames[v]
	}
	return "?"
}

// Reconciliation is what a reconciler answered.
type Reconciliation struct {
	Verdict Verdict
	// Output is Found's output, before stages 12 and 13.
	Output any
	// Err is why an Inconclusive answer is one (its error, a panic), for the
	// logs: never on the trail or the envelope.
	Err error
}

// Attempt is one call of a handler.
type Attempt struct {
	// N counts from 1; takeovers after a lost worker count too.
	N int
	// Key is the execution's idempotency key: the derivation its record
	// names, the same for every attempt (DESIGN §6).
	Key    string
	Logger *slog.Logger
	// Progress takes what the handler reports of its progress while the
	// attempt runs (DESIGN §5, "Progress"): never blocking, never failing.
	Progress *Reporter
	// Receipts records the evidence the attempt reports of its effect
	// (DESIGN §5): the port through which a handler's call.Receipt reaches
	// the execution's record, under the attempt's claim.
	Receipts Receipts
}

// Receipts records what an attempt's handler reports of its effect. It is
// the engine's, handed down with the attempt as its context is; the
// capability side only passes it on to the handler.
type Receipts interface {
	// RecordReceipt stores receipt as attempt n's evidence on the
	// execution's record, by compare-and-swap under the attempt's claim. It
	// fails (ErrReceiptRefused) once the attempt has ended, its lease was
	// lost, or the store did not answer.
	RecordReceipt(ctx context.Context, n int, receipt envelope.Raw) error
}
