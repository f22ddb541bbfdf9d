package executor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor/internal/engine"
	"github.com/capstan-dev/capstan/executor/internal/inputcheck"
)

// Call is what a handler receives besides its context: the validated input and
// the execution's identity.
type Call[In any] struct {
	// Input is the decoded and validated input: what policies and approvals
	// saw.
	Input In
	// ExecutionID is the same across runtime retries, redeliveries and
	// takeovers of one execution; a model calling the tool again gets a new one.
	ExecutionID string
	// CapabilityID names the capability called.
	CapabilityID string
	// Principal is who sent the request, as the server authenticated it
	// ("_anon" on a server without authentication): execution ids are
	// unique per principal, so an effect is the principal's and the id's
	// together.
	Principal string
	// IdempotencyKey is derived from Principal and ExecutionID together
	// (envelope.IdempotencyKey): pass it to the service where the effect
	// lives so that a repeated attempt changes nothing. Two principals'
	// executions of one id have two keys. An execution begun by a version
	// before v0.2 keeps the key of its id alone until it ends.
	IdempotencyKey string
	// Attempt counts from 1; takeovers after a lost worker count too.
	Attempt int
	// Actor is who the call runs for.
	Actor envelope.Actor
	// Surface is where the call came from.
	Surface Surface
	// CorrelationID ties executions of one conversation or workflow together
	// (a resume keeps the original call's).
	CorrelationID string
	// Approval is set when an approval authorized this execution.
	Approval *ApprovalGrant
	// Logger is the worker's logger with the execution's id, capability and
	// attempt attached.
	Logger *slog.Logger

	// receipts records the attempt's receipts (Receipt).
	receipts engine.Receipts
	// progress takes what Progress reports (nil outside a worker).
	progress *engine.Reporter
}

// Progress reports how far the attempt has got: done of total (0 when the
// total is not known) and a short message, one line of at most
// envelope.MaxProgressMessage bytes ("page 37 of 120"). Call it as often as
// you like, from any goroutine: it returns at once, never fails and never
// slows the attempt. The worker coalesces what is reported to at most four
// messages a second, publishes them to the
// execution's owner alone — the Go and TypeScript clients, capstan await
// and call, the MCP bridge's progress notifications and tasks, the console
// — and keeps the last one in the execution's record, which capstan status
// shows, with each lease renewal. Progress is best effort: a caller may
// miss some, and only the envelope tells how the execution ended. A value
// that is not finite, or is negative, counts as 0; reports made after the
// attempt ended are dropped, and so is everything a Call made outside a
// worker (a test's) reports. No output travels with progress: the output's
// checks (stages 12 and 13) apply to the whole output, in the envelope.
func (c Call[In]) Progress(done, total float64, message string) {
	c.progress.Report(c.Attempt, done, total, message)
}

// ApprovalGrant tells a handler which approval authorized it, and who decided.
type ApprovalGrant struct {
	// ID is the approval's.
	ID string
	// Approver decided it.
	Approver envelope.Actor
	// Comment is the approver's, if any.
	Comment string
}

// Handler runs a capability. ctx carries the per-attempt timeout and the
// caller's cancellation; forward it to every downstream call.
type Handler[In, Out any] func(ctx context.Context, call Call[In]) (Out, error)

// Validator is implemented by input and output types that check themselves
// after decoding.
type Validator interface {
	// Validate reports what is wrong with the value: an *envelope.InputError
	// for issues with paths, any other error as one issue.
	Validate() error
}

// InputSchema returns the JSON Schema of a capability's input type.
func InputSchema(c Capability) map[string]any {
	if c == nil {
		return nil
	}
	return inputcheck.JSONSchema(c.binding().inShape)
}

// Capability is a defined capability: metadata, input and output types and a
// handler. Make one with Define.
type Capability interface {
	// ID is the capability's id, as callers name it.
	ID() string
	// Meta is its metadata as Define was given it: a zero field stands for
	// its default (see Meta).
	Meta() Meta
	binding() *binding
}

// callInfo is the untyped part of a Call.
type callInfo struct {
	executionID    string
	capabilityID   string
	principal      string
	idempotencyKey string
	attempt        int
	actor          envelope.Actor
	surface        Surface
	correlationID  string
	approval       *ApprovalGrant
	logger         *slog.Logger
	progress       *engine.Reporter
	receipts       engine.Receipts
}

// binding is a capability with its types erased, as the pipeline drives it.
type binding struct {
	id      string
	meta    Meta
	inType  reflect.Type
	outType reflect.Type
	// inShape is how an input is checked and described (JSON Schema).
	inShape *inputcheck.Shape
	// decode is stage 5: it turns the request's input into the validated input
	// type (a pointer to it), or fails with an *InputError listing every issue
	// (or an internal *envelope.CapabilityError when Validate panics).
	decode func(raw envelope.Raw) (any, error)
	// checkOutput runs the output type's Validate method, if it has one, and
	// returns the output it validated (a pointer receiver may normalize it).
	checkOutput func(out any) (any, error)
	// invoke calls the handler with a decoded input.
	invoke func(ctx context.Context, ci callInfo, in any) (any, error)

	// Recovery (WithRecovery, DESIGN §5): what the engine is told, how a
	// receipt becomes the output, the reconciler (nil: none), and what is
	// wrong with the declaration, for NewRegistry.
	recovery         engine.Recovery
	fromReceipt      func(ctx context.Context, n int, receipt envelope.Raw) (any, error)
	reconcile        func(ctx context.Context, ci callInfo, in any) engine.Reconciliation
	recoveryProblems []string
}

type definition[In, Out any] struct{ b binding }

func (d *definition[In, Out]) ID() string        { return d.b.id }
func (d *definition[In, Out]) Meta() Meta        { return d.b.meta }
func (d *definition[In, Out]) binding() *binding { return &d.b }
func (d *definition[In, Out]) String() string    { return "capability " + d.b.id }

// Define makes a typed capability; opts add what metadata does not say
// (WithRecovery). Nothing is checked here: NewRegistry checks every
// capability at once and reports all problems together.
func Define[In, Out any](id string, meta Meta, h Handler[In, Out], opts ...Option[In, Out]) Capability {
	d := &definition[In, Out]{}
	inShape := inputcheck.ShapeOf(reflect.TypeFor[In]())
	outValidates := mayValidate[Out]()
	d.b = binding{
		id:      id,
		meta:    meta,
		inType:  reflect.TypeFor[In](),
		outType: reflect.TypeFor[Out](),
		inShape: inShape,
		decode: func(raw envelope.Raw) (any, error) {
			in, err := inputcheck.Decode[In](raw, inShape)
			if err != nil {
				return nil, err
			}
			if err := validateInput(validatorOf(in)); err != nil {
				return nil, err
			}
			return in, nil
		},
		checkOutput: func(out any) (any, error) {
			if !outValidates {
				o, _ := out.(Out)
				return o, nil
			}
			return validateOutput[Out](out)
		},
		invoke: func(ctx context.Context, ci callInfo, in any) (any, error) {
			if h == nil {
				return nil, fmt.Errorf("capability %s has no handler", id)
			}
			return h(ctx, Call[In]{
				Input:          *(in.(*In)),
				ExecutionID:    ci.executionID,
				CapabilityID:   ci.capabilityID,
				Principal:      ci.principal,
				IdempotencyKey: ci.idempotencyKey,
				Attempt:        ci.attempt,
				Actor:          ci.actor,
				Surface:        ci.surface,
				CorrelationID:  ci.correlationID,
				Approval:       ci.approval,
				Logger:         ci.logger,
				progress:       ci.progress,
				receipts:       ci.receipts,
			})
		},
		fromReceipt: func(_ context.Context, _ int, raw envelope.Raw) (any, error) {
			// The receipt is the output.
			var o Out
			err := raw.Decode(&o)
			return o, err
		},
	}
	if h == nil {
		d.b.invoke = nil
	}
	for _, o := range opts {
		if o != nil {
			o(d)
		}
	}
	return d
}

// mayValidate reports whether a T may have a Validate method (validatorOf):
// T's or *T's own, or, T an interface, its dynamic value's.
func mayValidate[T any]() bool {
	t, v := reflect.TypeFor[T](), reflect.TypeFor[Validator]()
	return t.Kind() == reflect.Interface || t.Implements(v) || reflect.PointerTo(t).Implements(v)
}

// validateOutput runs the output's Validate method and returns the output it
// validated (a pointer receiver may normalize it).
func validateOutput[Out any](out any) (any, error) {
	o, _ := out.(Out)
	return o, callValidate(validatorOf(&o))
}

// validatorOf finds the Validate method of *p: on T's value or pointer
// receiver, or on the pointer or interface value T itself holds.
func validatorOf[T any](p *T) Validator {
	if v, ok := any(p).(Validator); ok {
		return v
	}
	if v, ok := any(*p).(Validator); ok {
		return v
	}
	return nil
}

// validateInput runs the input's Validate method (a pointer receiver may
// normalize the input). Whatever it returns becomes issues; a panic is the
// capability's bug, not the caller's, and fails the call as an internal error.
func validateInput(v Validator) error {
	err := callValidate(v)
	if err == nil {
		return nil
	}
	var p *validatePanic
	if errors.As(err, &p) {
		return &envelope.CapabilityError{Code: envelope.CodeInternalError, Stage: envelope.StageInput,
			Message: "The operation failed.", Cause: err}
	}
	var ie *envelope.InputError
	if errors.As(err, &ie) {
		return ie
	}
	msg := err.Error()
	var ce *envelope.CapabilityError
	if errors.As(err, &ce) {
		msg = ce.Message // a declared error speaks its public message only
	}
	return inputcheck.NewInputError([]envelope.Issue{{Message: msg}}, err)
}

// callValidate calls v.Validate, if there is one, recovering a panic.
func callValidate(v Validator) (err error) {
	if v == nil {
		return nil
	}
	defer func() {
		if r := recover(); r != nil {
			err = &validatePanic{value: r}
		}
	}()
	return v.Validate()
}

type validatePanic struct{ value any }

func (p *validatePanic) Error() string { return fmt.Sprintf("Validate panicked: %v", p.value) }
