package executor

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/delivery"
	"github.com/capstan-dev/capstan/observe"
)

// The stages of DESIGN §4 that belong to a capability's definition: exposure,
// input, actor, policies and approval before the attempts (4 to 9), the retry
// rule between them (11), validation and redaction of the output (12, 13).
// The delivery machinery (internal/delivery) claims, leases, attempts,
// takes over and finalizes; it calls these through delivery.Capability and
// delivery.Admitted.

// capability is a registered capability as a worker's delivery machinery
// drives it.
type capability struct {
	b *binding
	w *Worker
}

// admission is one execution going through its capability's stages: what
// they established is what the attempts use.
type admission struct {
	*capability
	x   *delivery.Execution
	req *envelope.Request

	input     any // decoded, validated input (pointer to the input type)
	grant     *ApprovalGrant
	decisions []PolicyRecord // every policy stance so far, for the trail
}

func (c *capability) admission(x *delivery.Execution) *admission {
	return &admission{capability: c, x: x, req: x.Request()}
}

// Admit runs stages 4 to 9 (admit).
func (c *capability) Admit(x *delivery.Execution) delivery.Admitted {
	if a := c.admission(x); a.admit() {
		return a
	}
	return nil
}

// Readmit restores a takeover's input (stage 5 again) and the approval the
// execution consumed.
func (c *capability) Readmit(x *delivery.Execution) delivery.Admitted {
	a := c.admission(x)
	in, err := c.b.decode(a.req.Input)
	if err != nil {
		x.Fail(inputInvalid(err), 0)
		return nil
	}
	a.input = in
	if err := a.restoreGrant(); err != nil {
		x.Fail(err, x.Record().Attempt)
		return nil
	}
	return a
}

func (c *capability) Timeout() time.Duration      { return c.b.meta.timeout() }
func (c *capability) Retries() int                { return c.b.meta.maxAttempts() }
func (c *capability) Backoff(n int) time.Duration { return c.b.meta.backoff(n) }

// RetryEligible is the SI-11 rule: all must hold.
func (c *capability) RetryEligible(err *envelope.CapabilityError) bool {
	m := c.b.meta
	if m.maxAttempts() <= 0 || !err.Retryable {
		return false
	}
	if m.SideEffect.writeLike() && !m.Idempotent {
		return false
	}
	return m.Retry.RetryOn == nil || c.retryOn(err)
}

// retryOn asks the capability's RetryOn; one that panics vetoes the retry.
func (c *capability) retryOn(err *envelope.CapabilityError) (retry bool) {
	defer func() {
		if r := recover(); r != nil {
			c.w.log.Error("retryOn panicked: not retrying", "capabilityId", c.b.id, "panic", r)
			retry = false
		}
	}()
	return c.b.meta.Retry.RetryOn(err)
}

// Invoke is stage 11's call of the handler, with the validated input.
func (a *admission) Invoke(ctx context.Context, at delivery.Attempt) (any, error) {
	return a.b.invoke(ctx, callInfo{
		executionID: a.req.ExecutionID, capabilityID: a.req.CapabilityID,
		idempotencyKey: envelope.IdempotencyKey(a.req.ExecutionID), attempt: at.N,
		actor: a.req.Actor, surface: Surface(a.req.Surface), correlationID: a.req.CorrelationID,
		approval: a.grant, logger: at.Logger,
	}, a.input)
}

// CheckOutput is stages 12 and 13: validation, redaction, encoding. Nothing
// of an output that fails them leaves the worker.
func (a *admission) CheckOutput(out any) (envelope.Raw, *envelope.CapabilityError) {
	invalid := func(err error) *envelope.CapabilityError {
		return &envelope.CapabilityError{Code: envelope.CodeOutputInvalid, Stage: envelope.StageOutput, ExposeToModel: true,
			Message: "The operation ran, but its output is invalid; it was withheld.", Cause: err}
	}
	out, err := a.b.checkOutput(out)
	if err != nil {
		return nil, invalid(err)
	}
	out, err = redact(a.b.meta.RedactOutput, out)
	if err != nil {
		return nil, &envelope.CapabilityError{Code: envelope.CodeInternalError, Stage: envelope.StageRedaction,
			Message: "The operation failed.", Cause: err}
	}
	raw, err := envelope.NewRaw(out)
	if err != nil {
		return nil, invalid(err)
	}
	return raw, nil
}

// admit runs stages 4 to 9. It finalizes the execution itself when a stage
// refuses it, and reports whether the attempts may start.
func (a *admission) admit() bool {
	m := a.b.meta
	// 4: exposure, deny by default, enforced here whatever the caller was
	// shown. Concealed (SI-8): an unexposed capability, or one discovery would
	// not show this caller, fails exactly as an unknown one does; only the
	// trail says why.
	if !m.Expose.Has(Surface(a.req.Surface)) {
		a.conceal("not-exposed", envelope.StageExposure, nil)
		return false
	}
	if v := a.policies(PhaseDiscovery); v.stance == Deny || v.stance == Hide || v.failed {
		if v.failed && a.x.Context().Err() != nil {
			a.x.EndByContext(0)
			return false
		}
		a.conceal("hidden-at-discovery", envelope.StageExposure, v.records)
		return false
	}
	// 5: input, strictly decoded and validated: what policies, approvals and
	// the handler see from here on (SI-6).
	in, err := a.b.decode(a.req.Input)
	if err != nil {
		cerr := inputInvalid(err)
		if cerr.Code != envelope.CodeInputInvalid {
			a.x.Fail(cerr, 0) // the capability's bug, not a refusal
			return false
		}
		a.deny("input-invalid", cerr, nil)
		return false
	}
	a.input = in
	// 6: actor, then what the principal the server authenticated may do:
	// the subject's capability is the body's, and the actor, surface and
	// capability are within the principal's grant (DESIGN §12).
	if cerr := checkActor(a.req.Actor); cerr != nil {
		a.deny("unauthenticated", cerr, nil)
		return false
	}
	if sc := a.x.SubjectCapability(); sc != "" && sc != a.req.CapabilityID {
		a.deny("forbidden: the request names capability "+a.req.CapabilityID+" on the subject of "+sc,
			&envelope.CapabilityError{Code: envelope.CodeForbidden, Stage: envelope.StageActor, ExposeToModel: true,
				Message: "Not allowed: the request does not match its subject."}, nil)
		return false
	}
	if err := a.w.grants.CheckRequest(a.x.Principal(), a.req.Actor, a.req.Surface, a.req.CapabilityID); err != nil {
		var cerr *envelope.CapabilityError
		errors.As(err, &cerr)
		a.deny(strings.ToLower(string(cerr.Code))+": "+cerr.Cause.Error(), cerr, nil)
		return false
	}
	// 7: invocation-phase policies. A resume runs from stage 9: these
	// policies already asked for the approval it carries.
	var v verdict
	if a.req.ApprovalID == "" {
		v = a.policies(PhaseInvocation)
		if !a.policyGate(v, envelope.StagePolicy) {
			return false
		}
	}
	// 8: approval gate.
	if !a.approvalGate(v) {
		return false
	}
	// 9: execution-phase policies.
	v = a.policies(PhaseExecution)
	if v.stance == RequireApproval && a.grant != nil {
		v.stance = Allow // the approval already granted covers it
	}
	if v.stance == RequireApproval {
		v.stance, v.reasons = Deny, append(v.reasons, "approval required at execution")
	}
	return a.policyGate(v, envelope.StageExecPolicy)
}

// policies evaluates the runtime's policies, then the capability's own, for
// one phase. Every stance is kept for the trail.
func (a *admission) policies(phase Phase) verdict {
	if len(a.w.cfg.Policies)+len(a.b.meta.Policies) > 0 {
		defer a.x.Stage(observe.StagePolicies)(nil)
	}
	v := evaluatePolicies(a.x.Context(), a.w.cfg.Policies, a.b.meta.Policies, PolicyRequest{
		Phase: phase, CapabilityID: a.b.id, Meta: a.b.meta, Actor: a.req.Actor, Surface: Surface(a.req.Surface),
		Input: phaseInput(phase, a.input),
	}, a.w.cfg.PolicyTimeout)
	a.decisions = append(a.decisions, v.records...)
	return v
}

func phaseInput(phase Phase, in any) any {
	if phase == PhaseDiscovery {
		return nil
	}
	return in
}

// policyGate finalizes a refusal and reports whether the execution goes on.
func (a *admission) policyGate(v verdict, stage string) bool {
	switch {
	case v.failed && a.x.Context().Err() != nil:
		// The policies were cut off because the execution ended (a cancel, the
		// deadline, a lost claim, a shutdown): that decides, not the policies.
		a.x.EndByContext(0)
		return false
	case v.failed:
		a.deny("policy-failed", &envelope.CapabilityError{Code: envelope.CodePolicyFailed, Stage: stage,
			ExposeToModel: true, Message: "A policy could not be evaluated; the call was refused."}, v.records)
		return false
	case v.stance == Deny:
		a.deny("policy-denied", &envelope.CapabilityError{Code: envelope.CodePolicyDenied, Stage: stage,
			ExposeToModel: true, Message: "A policy refused the call."}, v.records)
		return false
	case v.stance == Hide:
		a.conceal("policy-hidden", stage, v.records)
		return false
	}
	return true
}

// deny finalizes a refusal before any attempt, its reason on the trail.
func (a *admission) deny(reason string, cerr *envelope.CapabilityError, records []PolicyRecord) {
	a.refuse(reason, cerr.Stage, cerr, records)
}

// conceal refuses as if the capability did not exist (SI-8). The trail keeps
// the true reason and stage; the caller sees what an unknown id gets.
func (a *admission) conceal(reason, stage string, records []PolicyRecord) {
	a.refuse(reason, stage, delivery.NotFoundError(), records)
}

func (a *admission) refuse(reason, stage string, cerr *envelope.CapabilityError, records []PolicyRecord) {
	data := map[string]any{"reason": reason, "publicCode": string(cerr.Code), "stage": stage}
	if len(records) > 0 {
		data["policyDecisions"] = records
	}
	a.x.Emit(audit.Denied, data)
	a.x.Fail(cerr, 0)
}

// StartedData is capability.started's data: the attempt, the approval, and
// every policy stance that let the execution start.
func (a *admission) StartedData(attempt int) map[string]any {
	data := map[string]any{"attempt": attempt, "approvalId": a.req.ApprovalID}
	if len(a.decisions) > 0 {
		data["policyDecisions"] = a.decisions
	}
	return data
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
