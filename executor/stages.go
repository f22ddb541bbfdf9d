package executor

import (
	"errors"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
)

// admit runs stages 4 to 9. It finalizes the execution itself when a stage
// refuses it, and reports whether the attempts may start.
func (x *execution) admit() bool {
	m := x.b.meta
	// 4: exposure, deny by default. Concealed: the caller cannot tell an
	// unexposed capability from an unknown one; the trail records why.
	if !m.Expose.Has(Surface(x.req.Surface)) {
		x.deny("not-exposed", notFoundError(envelope.StageExposure), nil)
		return false
	}
	// 5: input.
	in, err := x.b.decode(x.req.Input)
	if err == nil {
		err = validateValue(in)
	}
	if err != nil {
		x.deny("input-invalid", inputInvalid(err), nil)
		return false
	}
	x.input = in
	// 6: actor.
	if cerr := checkActor(x.req.Actor); cerr != nil {
		x.deny("unauthenticated", cerr, nil)
		return false
	}
	// 7: invocation-phase policies.
	v := x.policies(PhaseInvocation)
	if !x.policyGate(v) {
		return false
	}
	// 8: approval gate.
	if !x.approvalGate(v) {
		return false
	}
	// 9: execution-phase policies.
	v = x.policies(PhaseExecution)
	if v.stance == RequireApproval && x.grant != nil {
		v.stance = Allow // the approval already granted covers it
	}
	if v.stance == RequireApproval {
		v.stance, v.reasons = Deny, append(v.reasons, "approval required at execution")
	}
	return x.policyGate(v)
}

func (x *execution) policies(phase Phase) verdict {
	all := x.w.cfg.Policies
	if own := x.b.meta.Policies; len(own) > 0 {
		all = append(append([]Policy(nil), all...), own...)
	}
	if len(all) == 0 {
		return verdict{stance: Allow}
	}
	return evaluatePolicies(x.ctx, all, PolicyRequest{
		Phase: phase, CapabilityID: x.b.id, Meta: x.b.meta, Actor: x.req.Actor, Surface: Surface(x.req.Surface), Input: x.input,
	}, x.w.cfg.PolicyTimeout)
}

// policyGate finalizes a denial and reports whether the execution goes on.
func (x *execution) policyGate(v verdict) bool {
	switch {
	case v.failed && x.ctx.Err() != nil:
		// The policies were cut off because the execution ended (a cancel, the
		// deadline, a lost claim, a shutdown): that decides, not the policies.
		x.endByContext(0)
		return false
	case v.failed:
		x.deny("policy-failed", &envelope.CapabilityError{Code: envelope.CodePolicyFailed, Stage: envelope.StagePolicy,
			ExposeToModel: true, Message: "A policy could not be evaluated; the call was refused."}, v.records)
		return false
	case v.stance == Deny:
		x.deny("policy-denied", &envelope.CapabilityError{Code: envelope.CodePolicyDenied, Stage: envelope.StagePolicy,
			ExposeToModel: true, Message: "A policy refused the call."}, v.records)
		return false
	case v.stance == Hide:
		x.deny("policy-hidden", notFoundError(envelope.StagePolicy), v.records)
		return false
	}
	return true
}

// deny finalizes a refusal before any attempt, with the true reason audited.
func (x *execution) deny(reason string, cerr *envelope.CapabilityError, records []PolicyRecord) {
	data := map[string]any{"reason": reason, "publicCode": string(cerr.Code), "stage": cerr.Stage}
	if len(records) > 0 {
		data["policyDecisions"] = records
	}
	x.emit(audit.Denied, data)
	x.finalize(x.failed(cerr), 0)
}

func inputInvalid(err error) *envelope.CapabilityError {
	ce := &envelope.CapabilityError{Code: envelope.CodeInputInvalid, Stage: envelope.StageInput, ExposeToModel: true,
		Message: "The input is invalid.", Cause: err}
	var ie *InputError
	if errors.As(err, &ie) {
		ce.Details = map[string]any{"issues": ie.Issues}
	} else {
		ce.Details = map[string]any{"issues": []Issue{{Message: err.Error()}}}
	}
	return ce
}

// Issue is one problem of an input, at a path like "items[2].amount".
type Issue struct {
	Path    string `json:"path"`
	Message string `json:"message"`
}

// InputError lists every issue of an input.
type InputError struct{ Issues []Issue }

func (e *InputError) Error() string {
	if len(e.Issues) == 0 {
		return "invalid input"
	}
	s := ""
	for i, is := range e.Issues {
		if i > 0 {
			s += "; "
		}
		if is.Path != "" {
			s += is.Path + ": "
		}
		s += is.Message
	}
	return s
}

func validateValue(v any) error {
	if val, ok := v.(Validator); ok {
		return val.Validate()
	}
	return nil
}

func checkActor(a envelope.Actor) *envelope.CapabilityError {
	fail := func(msg string) *envelope.CapabilityError {
		return &envelope.CapabilityError{Code: envelope.CodeUnauthenticated, Stage: envelope.StageActor, ExposeToModel: true, Message: msg}
	}
	switch a.Kind {
	case envelope.ActorUser, envelope.ActorService, envelope.ActorAgent:
		if a.ID == "" {
			return fail("The actor has no id.")
		}
	case envelope.ActorAnonymous:
	case "":
		return fail("The call has no actor.")
	default:
		return fail("The actor's kind is not one of user, service, agent, anonymous.")
	}
	return nil
}
