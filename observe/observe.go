package observe

import (
	"context"
	"time"

	"github.com/capstan-dev/capstan/envelope"
)

// Delivery is what a worker knows of a request when it begins working on it.
type Delivery struct {
	// Request is the decoded request; observers must not change it.
	Request *envelope.Request
	// Pool and Worker name who works on it.
	Pool, Worker string
	// Deliveries counts JetStream's deliveries of the request, this one
	// included (1: the first; 0: unknown).
	Deliveries int
	// Stored is when JetStream stored the request, by the server's clock
	// (zero: unknown). Request.SubmittedAt is the client's to write: it
	// may be skewed, or made up.
	Stored time.Time
	// Known reports whether the worker serves the capability; an unknown one
	// is finalized CAPABILITY_NOT_FOUND.
	Known bool
}

// Stage names of the steps a worker reports with [Execution.Stage]: each one
// waits on the store.
const (
	StageClaim     = "claim"     // the execution record's create or takeover
	StagePolicies  = "policies"  // one phase's policies, when there are any (they may call out)
	StageApproval  = "approval"  // the approval gate: create, read or consume an approval
	StageStart     = "start"     // the record's running{n} write before attempt n (a short path's claim is that write)
	StageAudit     = "audit"     // a strict-mode capability.started stored before the handler
	StageFinalize  = "finalize"  // the envelope's create and the record's last update
	StageReceipt   = "receipt"   // a handler's receipt, written on the record by compare-and-swap
	StageReconcile = "reconcile" // a capability's reconciler asked whether a lost attempt took effect
)

// Worker is told what a worker does. See the package comment.
type Worker interface {
	// Begin is called when the worker takes a delivery to work on, before
	// its claim. The returned context is the execution's (the handler's
	// contexts derive from it); End on the returned Execution is called once
	// the worker is done with the delivery, whatever happened.
	Begin(ctx context.Context, d Delivery) (context.Context, Execution)
	// AuditFailed is called for each audit event JetStream did not store.
	AuditFailed()
	// Skipped is called for each record of bucket a listing skipped because
	// it does not decode (the listing goes on without it).
	Skipped(bucket string)
	// QuotaExceeded is called for each request the worker refused because
	// principal was over quota (auth.Quotas' field name, e.g.
	// controlPerSecond).
	QuotaExceeded(quota, principal string)
}

// Execution is told what happens to one delivery a worker works on.
type Execution interface {
	// Stage is called when a stage that does I/O starts (one of the Stage
	// constants); the returned func is called when it ends, with its error.
	Stage(ctx context.Context, name string) (context.Context, func(err error))
	// Attempt is called before the handler's attempt n (1 for the first).
	// The returned context is the handler's; the returned func is called when
	// the attempt ends, with the code of its failure ("" when it returned an
	// output).
	Attempt(ctx context.Context, n int) (context.Context, func(code envelope.Code))
	// Retried is called when attempt n begins after a failure with code
	// previous (WORKER_LOST after a takeover).
	Retried(n int, previous envelope.Code)
	// TakenOver is called when the worker takes the execution over from
	// another one, whose record was in state from.
	TakenOver(from string)
	// Limited is called when a limit of the capability held the execution
	// back (DESIGN §17): kind is the limit's (concurrency, rate, budget),
	// action what the execution did (wait, refuse, approval).
	Limited(kind, action string)
	// Slot is called when the execution takes a concurrency slot (held) and
	// when it gives it back.
	Slot(held bool)
	// Finalized is called with the envelope this worker created; never for a
	// delivery whose envelope already existed.
	Finalized(env *envelope.Envelope)
	// End is called once, when the worker is done with the delivery.
	End()
}

// Client is told what a client submits.
type Client interface {
	// Call is called for each request a client submits, before it is
	// published. It may set req.Traceparent (to a span of the call, a child of
	// the one ctx or the request already carries). The returned func is
	// called once: with the envelope when the client awaited it, with nil and
	// nil for a request only submitted, or with the transport error.
	Call(ctx context.Context, req *envelope.Request) func(env *envelope.Envelope, err error)
}

// NopWorker observes nothing; embed it to implement only some methods.
type NopWorker struct{}

// Begin returns ctx and a NopExecution.
func (NopWorker) Begin(ctx context.Context, _ Delivery) (context.Context, Execution) {
	return ctx, NopExecution{}
}

// AuditFailed does nothing.
func (NopWorker) AuditFailed() {}

// Skipped does nothing.
func (NopWorker) Skipped(string) {}

// QuotaExceeded does nothing.
func (NopWorker) QuotaExceeded(string, string) {}

// NopExecution observes nothing; embed it to implement only some methods.
type NopExecution struct{}

func endStage(error)           {}
func endAttempt(envelope.Code) {}

// Stage returns ctx.
func (NopExecution) Stage(ctx context.Context, _ string) (context.Context, func(error)) {
	return ctx, endStage
}

// Attempt returns ctx.
func (NopExecution) Attempt(ctx context.Context, _ int) (context.Context, func(envelope.Code)) {
	return ctx, endAttempt
}

// Retried does nothing.
func (NopExecution) Retried(int, envelope.Code) {}

// TakenOver does nothing.
func (NopExecution) TakenOver(string) {}

// Limited does nothing.
func (NopExecution) Limited(string, string) {}

// Slot does nothing.
func (NopExecution) Slot(bool) {}

// Finalized does nothing.
func (NopExecution) Finalized(*envelope.Envelope) {}

// End does nothing.
func (NopExecution) End() {}

// NopClient observes nothing.
type NopClient struct{}

func endCall(*envelope.Envelope, error) {}

// Call returns a func that does nothing.
func (NopClient) Call(context.Context, *envelope.Request) func(*envelope.Envelope, error) {
	return endCall
}
