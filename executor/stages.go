package executor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor/internal/engine"
	"github.com/capstan-dev/capstan/internal/pauses"
	"github.com/capstan-dev/capstan/internal/policies"
	"github.com/capstan-dev/capstan/observe"
)

// The stages of DESIGN §4 that belong to a capability's definition: exposure,
// input, actor, policies and approval before the attempts (4 to 9), the retry
// rule between them (11), validation and redaction of the output (12, 13).
// The engine (internal/engine) claims, leases, attempts, takes over and
// finalizes; it asks these through engine.Definition and gets decisions
// back (engine.Admission): they never write a record, an event or an
// envelope themselves.

// capability is a registered capability as a worker's engine drives it.
type capability struct {
	b *binding
	w *Worker
	// timeout is the attempt timeout its metadata sets.
	timeout time.Duration
	// cedar is what a Cedar policy sees of it (DESIGN §18).
	cedar policies.Capability
}

// admission is one execution going through its capability's stages: what
// they established is what the attempts use (it is the execution's
// engine.WorkUnit once admitted).
type admission struct {
	*capability
	ctx context.Context
	r   engine.Request
	req *envelope.Request

	input     any // decoded, validated input (pointer to the input type)
	grant     *ApprovalGrant
	decisions []PolicyRecord // every policy stance so far, for the trail
	events    []engine.Event // what the stages filed for the trail so far
	// policySet is the Cedar policy set in force when the call was last
	// decided (nil: none, or none asked yet). A set that does not load has
	// no version of its own to tell it from none.
	policySet *policies.Set
}

// policyVersion is the version of the Cedar policy set that decided the
// call (0: none in force).
func (a *admission) policyVersion() int {
	if a.policySet == nil {
		return 0
	}
	return a.policySet.Version
}

func newCapability(b *binding, w *Worker) *capability {
	m := b.meta
	return &capability{b: b, w: w, timeout: m.timeout(), cedar: policies.Capability{ID: b.id, SideEffect: string(m.SideEffect),
		Risk: string(m.Risk), Idempotent: m.Idempotent, Tags: m.Tags, InputSchema: inputSchema(b)}}
}

func (c *capability) admission(ctx context.Context, r engine.Request) *admission {
	return &admission{capability: c, ctx: ctx, r: r, req: r.Request}
}

// Admit runs stages 4 to 9 (admit).
func (c *capability) Admit(ctx context.Context, r engine.Request) engine.Admission {
	return c.admission(ctx, r).admit()
}

// Readmit restores a takeover's input (stage 5 again) and the approval the
// execution consumed.
func (c *capability) Readmit(ctx context.Context, r engine.Request) engine.Admission {
	a := c.admission(ctx, r)
	in, err := c.b.decode(a.req.Input)
	if err != nil {
		return a.fail(inputInvalid(err))
	}
	a.input = in
	if err := a.restoreGrant(); err != nil {
		return a.fail(err)
	}
	adm := a.admitted()
	adm.Limits, _ = a.limits(true) // a takeover takes its slot again, nothing else
	return adm
}

// Timeout bounds one attempt.
func (c *capability) Timeout() time.Duration { return c.timeout }

// Rerunnable reports whether running the capability twice is harmless: no
// write, or an idempotent one.
func (c *capability) Rerunnable() bool {
	return !c.b.meta.SideEffect.writeLike() || c.b.meta.Idempotent
}

// Unclaimed reports whether the capability's runs need no claim (DESIGN
// §14, "Reads without claims").
func (c *capability) Unclaimed() bool { return c.b.unclaimed() }

// unclaimed: a read declared Idempotent (Meta.unclaimed) that declares no
// recovery either, whose runs need no claim.
func (b *binding) unclaimed() bool { return b.meta.unclaimed() && b.recovery == (engine.Recovery{}) }

// Retry is the retry rule: attempt n, failed with err, is followed by
// another only when the SI-11 rule allows it (RetryEligible) and attempts
// are left, after the backoff.
func (c *capability) Retry(n int, err *envelope.CapabilityError) (time.Duration, bool) {
	if !c.RetryEligible(err) || n >= 1+c.b.meta.maxAttempts() {
		return 0, false
	}
	return c.b.meta.backoff(n), true
}

// RetryEligible is the SI-11 rule: all must hold.
func (c *capability) RetryEligible(err *envelope.CapabilityError) bool {
	m := c.b.meta
	if m.maxAttempts() <= 0 || !err.Retryable {
		return false
	}
	if !c.Rerunnable() {
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

// Started is capability.started's data: the attempt, the approval, and
// every policy stance that let the execution start.
func (a *admission) Started(attempt int) map[string]any {
	data := map[string]any{"attempt": attempt, "approvalId": a.req.ApprovalID}
	if len(a.decisions) > 0 {
		data["policyDecisions"] = a.decisions
	}
	if v := a.policyVersion(); v > 0 {
		data["policyVersion"] = v
	}
	return data
}

// Work is stage 11's call of the handler, with the validated input.
func (a *admission) Work(ctx context.Context, at engine.Attempt) (any, error) {
	ci := a.callInfo(at.N, at.Key, at.Logger)
	ci.receipts = at.Receipts
	ci.progress = at.Progress
	return a.b.invoke(ctx, ci, a.input)
}

// callInfo is what a handler (or a reconciler) is told of attempt n, given
// the idempotency key key (the engine's: the derivation the execution's
// record names).
func (a *admission) callInfo(n int, key string, logger *slog.Logger) callInfo {
	if logger == nil {
		logger = a.w.log.With("executionId", a.req.ExecutionID, "capabilityId", a.req.CapabilityID, "attempt", n)
	}
	return callInfo{
		executionID: a.req.ExecutionID, capabilityID: a.req.CapabilityID, principal: a.r.Principal,
		idempotencyKey: key, attempt: n,
		actor: a.req.Actor, surface: Surface(a.req.Surface), correlationID: a.req.CorrelationID,
		approval: a.grant, logger: logger,
	}
}

// Output is stages 12 and 13: validation, redaction, encoding. Nothing of
// an output that fails them leaves the worker.
func (a *admission) Output(out any) (envelope.Raw, *envelope.CapabilityError) {
	invalid := func(err error) *envelope.CapabilityError {
		return &envelope.CapabilityError{Code: envelope.CodeOutputInvalid, Stage: envelope.StageOutput, ExposeToModel: true,
			Message: "The operation ran, but its output is invalid; it was withheld.", Cause: err}
	}
	out, err := a.b.checkOutput(out)
	if err != nil {
		return nil, invalid(err)
	}
	if f := a.b.meta.RedactOutput; f != nil {
		if out, err = redact(f, out); err != nil {
			return nil, &envelope.CapabilityError{Code: envelope.CodeInternalError, Stage: envelope.StageRedaction,
				Message: "The operation failed.", Cause: err}
		}
	}
	raw, err := envelope.NewRaw(out)
	if err != nil {
		return nil, invalid(err)
	}
	return raw, nil
}

// admit runs stages 4 to 9 and returns their decision.
func (a *admission) admit() engine.Admission {
	m := a.b.meta
	// 4: exposure, deny by default, enforced here whatever the caller was
	// shown. Concealed (SI-8): an unexposed capability, or one discovery would
	// not show this caller, fails exactly as an unknown one does; only the
	// trail says why.
	if !slices.Contains(m.Expose, Surface(a.req.Surface)) {
		return a.conceal("not-exposed", envelope.StageExposure, nil)
	}
	if v := a.policies(PhaseDiscovery); v.stance == StanceDeny || v.stance == StanceHide || v.failed {
		if v.failed && a.ctx.Err() != nil {
			return a.stopped()
		}
		return a.conceal("hidden-at-discovery", envelope.StageExposure, v.records)
	}
	// 5: input, strictly decoded and validated: what policies, approvals and
	// the handler see from here on (SI-6).
	in, err := a.b.decode(a.req.Input)
	if err != nil {
		cerr := inputInvalid(err)
		if cerr.Code != envelope.CodeInputInvalid {
			return a.fail(cerr) // the capability's bug, not a refusal
		}
		return a.deny("input-invalid", cerr, nil)
	}
	a.input = in
	// 6: actor, then what the principal the server authenticated may do:
	// the subject's capability is the body's, and the actor, surface and
	// capability are within the principal's grant (DESIGN §12).
	if cerr := checkActor(a.req.Actor); cerr != nil {
		return a.deny("unauthenticated", cerr, nil)
	}
	if sc := a.r.SubjectCapability; sc != "" && sc != a.req.CapabilityID {
		return a.deny("forbidden: the request names capability "+a.req.CapabilityID+" on the subject of "+sc,
			&envelope.CapabilityError{Code: envelope.CodeForbidden, Stage: envelope.StageActor, ExposeToModel: true,
				Message: "Not allowed: the request does not match its subject."}, nil)
	}
	if err := a.w.grants.CheckRequest(a.r.Principal, a.req.Actor, a.req.Surface, a.req.CapabilityID); err != nil {
		var cerr *envelope.CapabilityError
		errors.As(err, &cerr)
		return a.deny(strings.ToLower(string(cerr.Code))+": "+cerr.Cause.Error(), cerr, nil)
	}
	// An operator's pause that refuses (DESIGN §18): once the caller may
	// know the capability, before its policies and approvals. One that
	// holds is the engine's, before the attempt.
	if p := a.w.pauseOf(a.r.Principal, a.req.CapabilityID, a.req.Actor); p != nil && p.Mode == pauses.Refuse {
		a.w.pauseRefused.Add(1)
		a.w.cfg.Observer.Paused(a.req.CapabilityID, "refused")
		return a.deny("paused: "+p.Scope.String()+": "+p.Reason, p.Refusal(), nil)
	}
	// 7: invocation-phase policies. A resume runs from stage 9: these
	// policies already asked for the approval it carries.
	var v verdict
	if a.req.ApprovalID == "" {
		v = a.policies(PhaseInvocation)
		if end, refused := a.policyGate(v, envelope.StagePolicy); refused {
			return end
		}
	}
	// 7, as data: the deployment's Cedar policy set in force, after the Go
	// policies; its deny is final. A resume is decided again: a set put in
	// force since its approval was asked for applies to it.
	if end, refused := a.cedarGate(); refused {
		return end
	}
	// 8: approval gate.
	if a.req.ApprovalID != "" || v.stance == StanceRequireApproval || (m.Approval != nil && m.Approval.Required) {
		if end, stop := a.approvalGate(v); stop {
			return end
		}
	}
	// 9: execution-phase policies.
	v = a.policies(PhaseExecution)
	if v.stance == StanceRequireApproval && a.grant != nil {
		v.stance = StanceAllow // the approval already granted covers it
	}
	if v.stance == StanceRequireApproval {
		v.stance, v.reasons = StanceDeny, append(v.reasons, "approval required at execution")
	}
	if end, refused := a.policyGate(v, envelope.StageExecPolicy); refused {
		return end
	}
	// The limits (DESIGN §17) are the engine's to take, last: a call any
	// stage refuses takes nothing.
	lims, cerr := a.limits(false)
	if cerr != nil {
		return a.deny("limit-amount", cerr, nil)
	}
	adm := a.admitted()
	adm.Limits, adm.Approved = lims, a.grant != nil
	if a.b.needsBudgetApproval() {
		adm.OverBudget = func(reason string) *engine.ApprovalNeeded {
			return a.requestApproval(verdict{stance: StanceRequireApproval, reasons: []string{"over its limit: " + reason}}).Approval
		}
	}
	return adm
}

// cedarPolicy names the Cedar policy set's stance among a call's policy
// decisions ("cedar", or "cedar:<policy id>").
const cedarPolicy = "cedar"

// cedarGate decides the call by the Cedar policy set in force (DESIGN
// §18): nothing at all when none is. A denial names the policy on the
// trail and in the private cause; the caller sees what a Go policy's denial
// shows, never why. A policy that cannot be evaluated fails the call closed.
func (a *admission) cedarGate() (end engine.Admission, refused bool) {
	set := a.w.policies.Load()
	a.policySet = set
	if set == nil {
		return engine.Admission{}, false
	}
	d := set.Decide(policies.Request{Principal: a.r.Principal, Actor: a.req.Actor, Capability: &a.cedar,
		Surface: a.req.Surface, Input: a.input})
	rec := PolicyRecord{Policy: cedarPolicy, Phase: PhaseInvocation, Stance: StanceAllow, Reason: d.Reason}
	if d.Policy != "" {
		rec.Policy = cedarPolicy + ":" + d.Policy
	}
	cause := fmt.Errorf("policy set v%d (Cedar): %s", d.Version, d.Reason)
	switch {
	case d.Failed:
		rec.Stance, rec.Failed, rec.Failure = StanceDeny, true, "error"
		return a.deny("policy-failed", &envelope.CapabilityError{Code: envelope.CodePolicyFailed, Stage: envelope.StagePolicy,
			ExposeToModel: true, Message: "A policy could not be evaluated; the call was refused.", Cause: cause}, append(a.decisions, rec)), true
	case !d.Allow:
		rec.Stance = StanceDeny
		return a.deny("policy-denied", &envelope.CapabilityError{Code: envelope.CodePolicyDenied, Stage: envelope.StagePolicy,
			ExposeToModel: true, Message: "A policy refused the call.", Cause: cause}, append(a.decisions, rec)), true
	}
	a.decisions = append(a.decisions, rec)
	return engine.Admission{}, false
}

// Recheck decides a retry again by the Cedar policy set in force (DESIGN
// §18): a set put in force since the call was admitted (or, for a
// takeover, any set) decides it as it decides a new call. Nothing is
// evaluated while the set that admitted the call stays in force.
func (a *admission) Recheck() ([]engine.Event, *envelope.CapabilityError) {
	if a.w.policies.Load() == a.policySet {
		return nil, nil
	}
	a.events = nil // filed at admission
	// The earlier set's stance no longer stands; the Go policies' do. A
	// new slice: the events filed so far hold the old one.
	a.decisions = slices.DeleteFunc(slices.Clone(a.decisions), func(r PolicyRecord) bool {
		return r.Policy == cedarPolicy || strings.HasPrefix(r.Policy, cedarPolicy+":")
	})
	end, refused := a.cedarGate()
	if !refused {
		return nil, nil
	}
	return end.Events, end.Refusal
}

// policies evaluates the runtime's policies, then the capability's own, for
// one phase. Every stance is kept for the trail.
func (a *admission) policies(phase Phase) verdict {
	if len(a.w.cfg.Policies)+len(a.b.meta.Policies) == 0 {
		return verdict{stance: StanceAllow} // what evaluatePolicies makes of none
	}
	defer a.stage(observe.StagePolicies)(nil)
	v := evaluatePolicies(a.ctx, a.w.cfg.Policies, a.b.meta.Policies, PolicyRequest{
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

// policyGate is a phase's verdict: the execution's end when it is refused
// (refused reports it), nothing otherwise.
func (a *admission) policyGate(v verdict, stage string) (end engine.Admission, refused bool) {
	switch {
	case v.failed && a.ctx.Err() != nil:
		// The policies were cut off because the execution ended (a cancel, the
		// deadline, a lost claim, a shutdown): that decides, not the policies.
		return a.stopped(), true
	case v.failed:
		return a.deny("policy-failed", &envelope.CapabilityError{Code: envelope.CodePolicyFailed, Stage: stage,
			ExposeToModel: true, Message: "A policy could not be evaluated; the call was refused."}, v.records), true
	case v.stance == StanceDeny:
		return a.deny("policy-denied", &envelope.CapabilityError{Code: envelope.CodePolicyDenied, Stage: stage,
			ExposeToModel: true, Message: "A policy refused the call."}, v.records), true
	case v.stance == StanceHide:
		return a.conceal("policy-hidden", stage, v.records), true
	}
	return engine.Admission{}, false
}

// deny refuses the execution before any attempt, its reason on the trail.
func (a *admission) deny(reason string, cerr *envelope.CapabilityError, records []PolicyRecord) engine.Admission {
	return a.refuse(reason, cerr.Stage, cerr, records)
}

// conceal refuses as if the capability did not exist (SI-8). The trail keeps
// the true reason and stage; the caller sees what an unknown id gets.
func (a *admission) conceal(reason, stage string, records []PolicyRecord) engine.Admission {
	return a.refuse(reason, stage, engine.NotFoundNear(a.w.nearName(a.r.Principal, a.req)), records)
}

func (a *admission) refuse(reason, stage string, cerr *envelope.CapabilityError, records []PolicyRecord) engine.Admission {
	data := map[string]any{"reason": reason, "publicCode": string(cerr.Code), "stage": stage}
	if len(records) > 0 {
		data["policyDecisions"] = records
	}
	if v := a.policyVersion(); v > 0 {
		data["policyVersion"] = v
	}
	a.file(audit.EventDenied, data)
	return a.fail(cerr)
}

// file adds an event to the trail the decision carries.
func (a *admission) file(typ string, data map[string]any) {
	a.events = append(a.events, engine.Event{Type: typ, Data: data})
}

// fail ends the execution with cerr, without a denial on the trail (a
// fault, not a refusal).
func (a *admission) fail(cerr *envelope.CapabilityError) engine.Admission {
	return engine.Admission{Events: a.events, Refusal: cerr}
}

// stopped leaves the end to the execution's context.
func (a *admission) stopped() engine.Admission {
	return engine.Admission{Events: a.events, Stopped: true}
}

// admitted lets the execution through to its attempts.
func (a *admission) admitted() engine.Admission {
	return engine.Admission{Events: a.events, Unit: a}
}

// stage tells the observer that a stage doing I/O starts, and returns its
// end.
func (a *admission) stage(name string) func(error) {
	if a.r.Observer == nil {
		return func(error) {}
	}
	_, end := a.r.Observer.Stage(a.ctx, name)
	return end
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
	var ie *envelope.InputError
	if errors.As(err, &ie) {
		ce.Details = map[string]any{"issues": ie.Issues}
	} else {
		ce.Details = map[string]any{"issues": []envelope.Issue{{Message: "the input does not decode"}}}
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
