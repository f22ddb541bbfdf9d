package executor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor/internal/engine"
)

// Receipts and reconcilers (DESIGN §5): two ways for a capability to turn
// "the worker was lost during an attempt, which may have run" into a known
// outcome, without ever running work that is not retried a second time on a
// guess.
//
//   - A handler records a receipt (Call.Receipt) as soon as its effect has
//     happened: the mail provider's message id, the payment's id. A takeover
//     that finds it finalizes completed from it.
//   - A capability declares a reconciler (Recovery.Reconcile): asked, on a
//     takeover of an attempt that left no receipt, whether the effect
//     happened where it lives. Found: completed from what it found. Absent,
//     where the capability declares that its reconciler proves absence: a
//     new attempt under the same idempotency key. Anything else:
//     OUTCOME_UNKNOWN, as without a reconciler.

// ErrReceiptRefused reports a receipt that was not recorded (Call.Receipt):
// the attempt had ended (its outcome was decided without it), its lease was
// lost, the store did not answer, or the receipt is empty or larger than
// MaxReceipt. The attempt's result will not be used either way; return.
var ErrReceiptRefused = engine.ErrReceiptRefused

// MaxReceipt is the largest receipt, encoded, a handler may record: it
// rides every later write of the execution's record.
const MaxReceipt = engine.MaxReceipt

// Receipt records v as durable evidence that this attempt's effect has
// happened: call it as soon as it has (the provider accepted the email, the
// payment went through), before anything else that may fail or take time. It
// is written on the execution's record by compare-and-swap under the
// attempt's claim, one round trip; a handler that never calls it pays
// nothing.
//
// Should the worker be lost, or the attempt be stopped by its timeout or the
// caller's cancel, before the handler returns, the execution ends completed
// from the receipt instead of OUTCOME_UNKNOWN or TIMEOUT: v itself is the
// output (it must then be of the output type), unless the capability's
// Recovery.FromReceipt makes the output of it. Either way stages 12 and 13
// (validation, redaction) apply to that output. An attempt that returns
// decides by what it returns: its receipt is not used.
//
// A receipt is output-grade data: whoever may read the execution's record
// (its workers, admins, its producer) may read it, for the record window;
// the audit trail holds its SHA-256 only (SI-10). Keep it small: an id, not
// a document.
//
// It returns ErrReceiptRefused (wrapped) when the receipt was not recorded.
// Calling it again replaces the attempt's receipt.
func (c Call[In]) Receipt(ctx context.Context, v any) error {
	if c.receipts == nil {
		return fmt.Errorf("%w: this call was not made by a worker", ErrReceiptRefused)
	}
	raw, err := envelope.NewRaw(v)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrReceiptRefused, err)
	}
	return c.receipts.RecordReceipt(ctx, c.Attempt, raw)
}

// Recovery declares how a capability's lost attempts are recovered (see
// WithRecovery): how a receipt becomes the output, and a reconciler.
type Recovery[In, Out any] struct {
	// FromReceipt makes the output of a receipt a handler recorded (decode
	// it with Receipt.Decode). Nil: the receipt is the output, decoded as
	// Out.
	FromReceipt func(ctx context.Context, r Receipt) (Out, error)
	// Reconcile asks the system where the effect lives whether the lost
	// attempt took effect, by the execution's idempotency key. It runs on a
	// takeover of an attempt that left no receipt, a cancelled one's too,
	// under Timeout (a cancel does not cut it off: no cancel stops the lost
	// attempt, and the answer says what became of it), held under a claim
	// and a lease as an attempt is (a worker lost while it asks is taken
	// over and asks again). Return
	// Found with the output, Absent, or Unknown; an error, a panic or the
	// time running out count as Unknown. One that ignores its context is
	// abandoned when its time runs out, as a handler is: the takeover goes
	// on without it, and an answer it gives later is not used.
	Reconcile func(ctx context.Context, q Reconciliation[In]) (Reconciled[Out], error)
	// ProvesAbsence declares that Reconcile's Absent is authoritative: the
	// system where the effect lives says that it did not happen, and it
	// folds a late effect of the lost attempt (a worker cut off, whose
	// handler ignores its context) into the new attempt's, because both
	// carry the same idempotency key. Only then does a new attempt of work
	// that is not retried run (DESIGN §5, rule A); like Idempotent, it is a
	// reviewable claim. Without it, Absent is taken for Unknown.
	ProvesAbsence bool
	// MaxReattempts bounds the attempts a proof of absence may start for one
	// execution (default 2): a handler whose workers keep dying before its
	// effect ends failed, retryable, rather than take every worker down.
	MaxReattempts int
	// Timeout bounds one reconciliation, and one FromReceipt. Default 10 s.
	Timeout time.Duration
}

// Receipt is a receipt a handler recorded (Call.Receipt), as
// Recovery.FromReceipt reads it.
type Receipt struct {
	// Attempt is the attempt that recorded it.
	Attempt int
	raw     envelope.Raw
}

// Decode decodes the receipt into v, a pointer to the type the handler
// recorded.
func (r Receipt) Decode(v any) error { return r.raw.Decode(v) }

// Reconciliation is what a reconciler is asked about: one execution and its
// lost attempt.
type Reconciliation[In any] struct {
	// Input is the validated input, as the handler received it.
	Input        In
	ExecutionID  string // the execution whose attempt was lost, as Call.ExecutionID
	CapabilityID string // the capability called
	Principal    string // who sent the request, as Call.Principal
	// IdempotencyKey is the key the lost attempt used (as Call.IdempotencyKey:
	// the derivation the execution's record names): where the effect lives,
	// look it up by this.
	IdempotencyKey string
	// Attempt is the lost attempt.
	Attempt int
	Actor   envelope.Actor // who the call runs for, as Call.Actor
	Logger  *slog.Logger   // the worker's logger with the execution's id, capability and attempt attached
}

// Effect is a reconciler's answer.
type Effect int

// What a reconciler found.
const (
	// EffectUnknown: it cannot tell (the zero value).
	EffectUnknown Effect = iota
	// EffectFound: the effect happened; Reconciled.Output is the output.
	EffectFound
	// EffectAbsent: the effect did not happen (authoritative only with
	// Recovery.ProvesAbsence).
	EffectAbsent
)

// Reconciled is a reconciler's answer: the effect, and the output when it
// was found.
type Reconciled[Out any] struct {
	Effect Effect // what the reconciler found; the zero value is EffectUnknown
	Output Out    // the execution's output, with EffectFound only
}

// Found is the answer of a reconciler that found the effect: out is the
// execution's output.
func Found[Out any](out Out) Reconciled[Out] {
	return Reconciled[Out]{Effect: EffectFound, Output: out}
}

// Option configures a capability beyond its metadata (Define).
type Option[In, Out any] func(*definition[In, Out])

// WithRecovery declares how the capability's lost attempts are recovered:
// from receipts (FromReceipt) and by a reconciler (Reconcile).
func WithRecovery[In, Out any](r Recovery[In, Out]) Option[In, Out] {
	return func(d *definition[In, Out]) {
		b := &d.b
		if r.ProvesAbsence && r.Reconcile == nil {
			b.recoveryProblems = append(b.recoveryProblems, "recovery.provesAbsence is set without a reconciler")
		}
		if r.MaxReattempts < 0 {
			b.recoveryProblems = append(b.recoveryProblems, fmt.Sprintf("recovery.maxReattempts %d is negative", r.MaxReattempts))
		}
		if r.Timeout < 0 {
			b.recoveryProblems = append(b.recoveryProblems, fmt.Sprintf("recovery.timeout %v is negative", r.Timeout))
		}
		max := r.MaxReattempts
		if max == 0 {
			max = defaultMaxReattempts
		}
		b.recovery = engine.Recovery{Reconciles: r.Reconcile != nil, ProvesAbsence: r.ProvesAbsence && r.Reconcile != nil,
			MaxReattempts: max, Timeout: r.Timeout}
		if f := r.FromReceipt; f != nil {
			b.fromReceipt = func(ctx context.Context, n int, raw envelope.Raw) (any, error) {
				return f(ctx, Receipt{Attempt: n, raw: raw})
			}
		}
		if f := r.Reconcile; f != nil {
			b.reconcile = func(ctx context.Context, ci callInfo, in any) engine.Reconciliation {
				got, err := f(ctx, Reconciliation[In]{Input: *(in.(*In)), ExecutionID: ci.executionID,
					CapabilityID: ci.capabilityID, Principal: ci.principal, IdempotencyKey: ci.idempotencyKey, Attempt: ci.attempt, Actor: ci.actor,
					Logger: ci.logger})
				switch {
				case err != nil:
					return engine.Reconciliation{Verdict: engine.Inconclusive, Err: err}
				case got.Effect == EffectFound:
					return engine.Reconciliation{Verdict: engine.Found, Output: got.Output}
				case got.Effect == EffectAbsent:
					return engine.Reconciliation{Verdict: engine.Absent}
				}
				return engine.Reconciliation{Verdict: engine.Inconclusive}
			}
		}
	}
}

// defaultMaxReattempts is how many attempts a reconciler's proofs of
// absence may start for one execution unless Recovery.MaxReattempts says.
const defaultMaxReattempts = 2

// errNoReconciler is what a reconciliation of a capability without one
// answers (the engine never asks: Recovery().Reconciles is false).
var errNoReconciler = errors.New("capability has no reconciler")

// Recovery is what the capability declares for a lost attempt.
func (c *capability) Recovery() engine.Recovery { return c.b.recovery }

// FromReceipt is the output attempt n's receipt stands for: the receipt
// decoded as the output type, or what the capability's FromReceipt makes of
// it.
func (a *admission) FromReceipt(ctx context.Context, n int, receipt envelope.Raw) (any, error) {
	return a.b.fromReceipt(ctx, n, receipt)
}

// Reconcile asks the capability's reconciler about attempt n, given key.
func (a *admission) Reconcile(ctx context.Context, n int, key string) engine.Reconciliation {
	if a.b.reconcile == nil {
		return engine.Reconciliation{Verdict: engine.Inconclusive, Err: errNoReconciler}
	}
	return a.b.reconcile(ctx, a.callInfo(n, key, nil), a.input)
}
