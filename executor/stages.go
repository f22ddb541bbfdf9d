package executor

import (
	"errors"
	"fmt"
	"unicode"
	"unicode/utf8"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
)

// admit runs stages 4 to 9. It finalizes the execution itself when a stage
// refuses it, and reports whether the attempts may start.
func (x *execution) admit() bool {
	m := x.b.meta
	// 4: exposure, deny by default, enforced here whatever the caller was
	// shown. Concealed (SI-8): an unexposed capability, or one discovery would
	// not show this caller, fails exactly as an unknown one does; only the
	// trail says why.
	if !m.Expose.Has(Surface(x.req.Surface)) {
		x.conceal("not-exposed", envelope.StageExposure, nil)
		return false
	}
	if v := x.policies(PhaseDiscovery); v.stance == Deny || v.stance == Hide || v.failed {
		if v.failed && x.ctx.Err() != nil {
			x.endByContext(0)
			return false
		}
		x.conceal("hidden-at-discovery", envelope.StageExposure, v.records)
		return false
	}
	// 5: input, strictly decoded and validated: what policies, approvals and
	// the handler see from here on (SI-6).
	in, err := x.b.decode(x.req.Input)
	if err != nil {
		cerr := inputInvalid(err)
		if cerr.Code != envelope.CodeInputInvalid {
			x.finalize(x.failed(cerr), 0) // the capability's bug, not a refusal
			return false
		}
		x.deny("input-invalid", cerr, nil)
		return false
	}
	x.input = in
	// 6: actor.
	if cerr := checkActor(x.req.Actor); cerr != nil {
		x.deny("unauthenticated", cerr, nil)
		return false
	}
	// 7: invocation-phase policies. A resume runs from stage 9: these
	// policies already asked for the approval it carries.
	var v verdict
	if x.req.ApprovalID == "" {
		v = x.policies(PhaseInvocation)
		if !x.policyGate(v, envelope.StagePolicy) {
			return false
		}
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
	return x.policyGate(v, envelope.StageExecPolicy)
}

// policies evaluates the runtime's policies, then the capability's own, for
// one phase. Every stance is kept for the trail.
func (x *execution) policies(phase Phase) verdict {
	v := evaluatePolicies(x.ctx, x.w.cfg.Policies, x.b.meta.Policies, PolicyRequest{
		Phase: phase, CapabilityID: x.b.id, Meta: x.b.meta, Actor: x.req.Actor, Surface: Surface(x.req.Surface),
		Input: phaseInput(phase, x.input),
	}, x.w.cfg.PolicyTimeout)
	x.decisions = append(x.decisions, v.records...)
	return v
}

func phaseInput(phase Phase, in any) any {
	if phase == PhaseDiscovery {
		return nil
	}
	return in
}

// policyGate finalizes a refusal and reports whether the execution goes on.
func (x *execution) policyGate(v verdict, stage string) bool {
	switch {
	case v.failed && x.ctx.Err() != nil:
		// The policies were cut off because the execution ended (a cancel, the
		// deadline, a lost claim, a shutdown): that decides, not the policies.
		x.endByContext(0)
		return false
	case v.failed:
		x.deny("policy-failed", &envelope.CapabilityError{Code: envelope.CodePolicyFailed, Stage: stage,
			ExposeToModel: true, Message: "A policy could not be evaluated; the call was refused."}, v.records)
		return false
	case v.stance == Deny:
		x.deny("policy-denied", &envelope.CapabilityError{Code: envelope.CodePolicyDenied, Stage: stage,
			ExposeToModel: true, Message: "A policy refused the call."}, v.records)
		return false
	case v.stance == Hide:
		x.conceal("policy-hidden", stage, v.records)
		return false
	}
	return true
}

// deny finalizes a refusal before any attempt, its reason on the trail.
func (x *execution) deny(reason string, cerr *envelope.CapabilityError, records []PolicyRecord) {
	x.refuse(reason, cerr.Stage, cerr, records)
}

// conceal refuses as if the capability did not exist (SI-8). The trail keeps
// the true reason and stage; the caller sees what an unknown id gets.
func (x *execution) conceal(reason, stage string, records []PolicyRecord) {
	x.refuse(reason, stage, notFoundError(), records)
}

func (x *execution) refuse(reason, stage string, cerr *envelope.CapabilityError, records []PolicyRecord) {
	data := map[string]any{"reason": reason, "publicCode": string(cerr.Code), "stage": stage}
	if len(records) > 0 {
		data["policyDecisions"] = records
	}
	x.emit(audit.Denied, data)
	x.finalize(x.failed(cerr), 0)
}

// startedData is capability.started's data: the attempt, the approval, and
// every policy stance that let the execution start.
func (x *execution) startedData(attempt int) map[string]any {
	data := map[string]any{"attempt": attempt, "approvalId": x.req.ApprovalID}
	if len(x.decisions) > 0 {
		data["policyDecisions"] = x.decisions
	}
	return data
}

// notFoundError is the one answer for an unknown, unexposed or hidden
// capability: the same bytes whichever it was (SI-8).
func notFoundError() *envelope.CapabilityError {
	return &envelope.CapabilityError{Code: envelope.CodeCapabilityNotFound, Stage: envelope.StageResolve, ExposeToModel: true,
		Message: "No such capability."}
}

// inputInvalid turns a stage-5 error into the caller's INPUT_INVALID, with
// every issue in details. An internal error (a Validate that panicked) passes
// through.
func inputInvalid(err error) *envelope.CapabilityError {
	var ce *envelope.CapabilityError
	if errors.As(err, &ce) {
		return ce
	}
	ce = &envelope.CapabilityError{Code: envelope.CodeInputInvalid, Stage: envelope.StageInput, ExposeToModel: true,
		Message: "The input is invalid.", Cause: err}
	var ie *InputError
	if errors.As(err, &ie) {
		ce.Details = map[string]any{"issues": ie.Issues}
	} else {
		ce.Details = map[string]any{"issues": []Issue{{Message: "the input does not decode"}}}
	}
	return ce
}

// Limits of a well-formed actor.
const (
	maxActorID    = 256
	maxActorAttrs = 64
	maxActorAttr  = 1024
)

// checkActor is stage 6 (SI-3): an actor is present and well-formed, its kind
// one of user, service, agent or anonymous. Anonymous is always explicit: an
// actor left out is refused, never taken for anonymous.
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
	if !wellFormed(a.ID, maxActorID) {
		return fail(fmt.Sprintf("The actor's id is not well-formed (printable UTF-8, at most %d bytes).", maxActorID))
	}
	if len(a.Attrs) > maxActorAttrs {
		return fail(fmt.Sprintf("The actor has more than %d attributes.", maxActorAttrs))
	}
	for k, v := range a.Attrs {
		if k == "" || !wellFormed(k, maxActorAttr) || !utf8.ValidString(v) || len(v) > maxActorAttr {
			return fail("The actor's attributes are not well-formed.")
		}
	}
	return nil
}

func wellFormed(s string, max int) bool {
	if len(s) > max || !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}
