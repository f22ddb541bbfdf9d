package executor

import (
	"context"
	"fmt"
	"log/slog"
	"reflect"

	"github.com/capstan-dev/capstan/envelope"
)

// Call is what a handler receives besides its context: the validated input and
// the execution's identity.
type Call[In any] struct {
	Input In
	// ExecutionID is the same across runtime retries, redeliveries and
	// takeovers of one execution; a model calling the tool again gets a new one.
	ExecutionID  string
	CapabilityID string
	// IdempotencyKey is derived from ExecutionID alone: pass it to the service
	// where the effect lives so that a repeated attempt changes nothing.
	IdempotencyKey string
	// Attempt counts from 1; takeovers after a lost worker count too.
	Attempt       int
	Actor         envelope.Actor
	Surface       Surface
	CorrelationID string
	// Approval is set when an approval authorized this execution.
	Approval *ApprovalGrant
	Logger   *slog.Logger
}

// ApprovalGrant tells a handler which approval authorized it, and who decided.
type ApprovalGrant struct {
	ID       string
	Approver envelope.Actor
	Comment  string
}

// Handler runs a capability. ctx carries the per-attempt timeout and the
// caller's cancellation; forward it to every downstream call.
type Handler[In, Out any] func(ctx context.Context, call Call[In]) (Out, error)

// Validator is implemented by input and output types that check themselves
// after decoding.
type Validator interface{ Validate() error }

// Capability is a defined capability: metadata, input and output types and a
// handler. Make one with Define.
type Capability interface {
	ID() string
	Meta() Meta
	binding() *binding
}

// callInfo is the untyped part of a Call.
type callInfo struct {
	executionID    string
	capabilityID   string
	idempotencyKey string
	attempt        int
	actor          envelope.Actor
	surface        Surface
	correlationID  string
	approval       *ApprovalGrant
	logger         *slog.Logger
}

// binding is a capability with its types erased, as the pipeline drives it.
type binding struct {
	id      string
	meta    Meta
	inType  reflect.Type
	outType reflect.Type
	// decode turns the request's input into the input type (a pointer to it).
	decode func(raw envelope.Raw) (any, error)
	// invoke calls the handler with a decoded input.
	invoke func(ctx context.Context, ci callInfo, in any) (any, error)
}

type definition[In, Out any] struct{ b binding }

func (d *definition[In, Out]) ID() string        { return d.b.id }
func (d *definition[In, Out]) Meta() Meta        { return d.b.meta }
func (d *definition[In, Out]) binding() *binding { return &d.b }
func (d *definition[In, Out]) String() string    { return "capability " + d.b.id }

// Define makes a typed capability. Nothing is checked here: NewRegistry checks
// every capability at once and reports all problems together.
func Define[In, Out any](id string, meta Meta, h Handler[In, Out]) Capability {
	d := &definition[In, Out]{}
	d.b = binding{
		id:      id,
		meta:    meta,
		inType:  reflect.TypeFor[In](),
		outType: reflect.TypeFor[Out](),
		decode: func(raw envelope.Raw) (any, error) {
			in := new(In)
			if len(raw) == 0 {
				return in, nil
			}
			if err := envelope.UnmarshalStrict(raw, in); err != nil {
				return nil, err
			}
			return in, nil
		},
		invoke: func(ctx context.Context, ci callInfo, in any) (any, error) {
			if h == nil {
				return nil, fmt.Errorf("capability %s has no handler", id)
			}
			return h(ctx, Call[In]{
				Input:          *(in.(*In)),
				ExecutionID:    ci.executionID,
				CapabilityID:   ci.capabilityID,
				IdempotencyKey: ci.idempotencyKey,
				Attempt:        ci.attempt,
				Actor:          ci.actor,
				Surface:        ci.surface,
				CorrelationID:  ci.correlationID,
				Approval:       ci.approval,
				Logger:         ci.logger,
			})
		},
	}
	if h == nil {
		d.b.invoke = nil
	}
	return d
}
