package executor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/capstan-dev/capstan/envelope"
)

// Phase is when a policy is evaluated.
type Phase string

// Phases.
const (
	// PhaseDiscovery: while describing capabilities to a caller, and again at
	// stage 4 of every call, so that what discovery hides from a caller stays
	// concealed when it calls anyway (a deny, hide or failure there answers
	// CAPABILITY_NOT_FOUND). The request carries no input. To conceal a
	// capability from an actor whatever the input, hide it in this phase: an
	// invocation-phase hide is reached only by calls whose input is valid.
	PhaseDiscovery Phase = "discovery"
	// PhaseInvocation: stage 7, before the approval gate.
	PhaseInvocation Phase = "invocation"
	// PhaseExecution: stage 9, after approval, just before the handler.
	PhaseExecution Phase = "execution"
)

// Stance is a policy's answer.
type Stance string

// Stances, strongest first: deny > hide > require-approval > allow.
const (
	StanceDeny            Stance = "deny"
	StanceHide            Stance = "hide"
	StanceRequireApproval Stance = "require-approval"
	StanceAllow           Stance = "allow"
)

func (s Stance) rank() int {
	switch s {
	case StanceDeny:
		return 3
	case StanceHide:
		return 2
	case StanceRequireApproval:
		return 1
	}
	return 0
}

// Decision is one policy's stance with its reason.
type Decision struct {
	// Stance is the policy's answer; empty is StanceAllow.
	Stance Stance
	// Reason says why, for the audit trail and (for a denial) the caller.
	Reason string
	// ApprovalTypes name the kinds of approval required (with StanceRequireApproval).
	ApprovalTypes []string
}

// PolicyRequest is what a policy sees: the validated input, never raw bytes
// (SI-6). Input is shared with the handler: a policy must not change it.
type PolicyRequest struct {
	// Phase is when the policy is asked: discovery, invocation or execution.
	Phase Phase
	// CapabilityID and Meta are the capability's.
	CapabilityID string
	Meta         Meta // the capability's metadata, as Define was given it
	// Actor is who the call runs for; Surface where it came from.
	Actor   envelope.Actor
	Surface Surface // direct, mcp or http: fixed by the caller's client
	// Input is a pointer to the capability's validated input type (nil in the
	// discovery phase).
	Input any
}

// Policy decides whether a call may go on. Evaluate must be quick and must not
// have effects; one that errors, panics or outlives the policy timeout fails
// closed.
type Policy struct {
	// Name identifies the policy in the audit trail.
	Name string
	// Phases it applies to; empty means invocation only.
	Phases []Phase
	// Evaluate decides; ctx carries the policy timeout.
	Evaluate func(ctx context.Context, r PolicyRequest) (Decision, error)
	// MayRequireApproval declares that Evaluate may answer StanceRequireApproval
	// for some inputs ("refunds above 500"): describe, the catalog and MCP
	// tools then say that a call may need someone else's approval. It
	// changes nothing of what the policy decides.
	MayRequireApproval bool
}

func (p Policy) appliesTo(ph Phase) bool {
	if len(p.Phases) == 0 {
		return ph == PhaseInvocation
	}
	for _, x := range p.Phases {
		if x == ph {
			return true
		}
	}
	return false
}

// PolicyRecord is one evaluated stance, as the audit trail records it.
type PolicyRecord struct {
	// Policy is the policy's name; Phase when it was asked.
	Policy string `json:"policy"`
	Phase  Phase  `json:"phase"` // discovery, invocation or execution
	// Stance and Reason are what it answered.
	Stance Stance `json:"stance"`
	Reason string `json:"reason,omitempty"` // the Decision's Reason
	// Failed is set when the policy errored, panicked, timed out or answered
	// an unknown stance; its stance is then deny.
	Failed bool `json:"failed,omitempty"`
	// Failure says how it failed: error, panic, timeout or invalid-stance.
	Failure string `json:"failure,omitempty"`
}

// verdict merges every stance of one phase.
type verdict struct {
	stance        Stance
	failed        bool // a policy failed closed
	reasons       []string
	approvalTypes []string
	records       []PolicyRecord
}

// defaultPolicyTimeout bounds one policy's evaluation.
const defaultPolicyTimeout = time.Second

// evaluatePolicies runs every policy of the runtime, then of the capability,
// that applies to the phase: all of them, with no short-circuit, so that the
// trail records every stance. Stances merge by precedence deny > hide >
// require-approval > allow, approval requirements are merged. A policy that
// errors, panics, times out or answers an unknown stance counts as deny and
// marks the verdict failed (SI-7).
func evaluatePolicies(ctx context.Context, runtime, own []Policy, r PolicyRequest, timeout time.Duration) verdict {
	v := verdict{stance: StanceAllow}
	for _, set := range [2][]Policy{runtime, own} {
		for _, p := range set {
			if !p.appliesTo(r.Phase) {
				continue
			}
			d, err := runPolicy(ctx, p, r, timeout)
			if d.Stance == "" {
				d.Stance = StanceAllow
			}
			rec := PolicyRecord{Policy: p.Name, Phase: r.Phase, Stance: d.Stance, Reason: d.Reason}
			var pf *policyFailure
			if errors.As(err, &pf) {
				rec.Stance, rec.Failed, rec.Failure, rec.Reason = StanceDeny, true, pf.kind, pf.Error()
				v.failed = true
				d = Decision{Stance: StanceDeny, Reason: pf.Error()}
			}
			v.records = append(v.records, rec)
			if d.Stance.rank() > v.stance.rank() {
				v.stance = d.Stance
			}
			if d.Stance != StanceAllow && d.Reason != "" {
				v.reasons = append(v.reasons, d.Reason)
			}
			if d.Stance == StanceRequireApproval {
				v.approvalTypes = appendUnique(v.approvalTypes, d.ApprovalTypes...)
			}
		}
	}
	return v
}

// policyFailure is a policy that could not decide.
type policyFailure struct {
	policy string
	kind   string // error, panic, timeout, invalid-stance
	msg    string
}

func (f *policyFailure) Error() string { return "policy " + f.policy + ": " + f.msg }

// runPolicy evaluates one policy under the timeout, recovering a panic. A
// policy that outlives its timeout is left to return on its own; its answer
// is ignored.
func runPolicy(ctx context.Context, p Policy, r PolicyRequest, timeout time.Duration) (Decision, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	type result struct {
		d   Decision
		err error
	}
	fail := func(kind, format string, args ...any) (Decision, error) {
		return Decision{}, &policyFailure{policy: p.Name, kind: kind, msg: fmt.Sprintf(format, args...)}
	}
	if p.Evaluate == nil {
		return fail("error", "has no Evaluate function")
	}
	ch := make(chan result, 1)
	go func() {
		defer func() {
			if rec := recover(); rec != nil {
				ch <- result{err: &policyFailure{policy: p.Name, kind: "panic", msg: fmt.Sprintf("panicked: %v", rec)}}
			}
		}()
		d, err := p.Evaluate(ctx, r)
		ch <- result{d, err}
	}()
	select {
	case res := <-ch:
		var pf *policyFailure
		switch {
		case errors.As(res.err, &pf):
			return Decision{}, pf
		case res.err != nil:
			return fail("error", "failed: %v", res.err)
		}
		switch res.d.Stance {
		case "", StanceAllow, StanceDeny, StanceHide, StanceRequireApproval:
		default:
			return fail("invalid-stance", "answered an unknown stance %q", res.d.Stance)
		}
		return res.d, nil
	case <-ctx.Done():
		return fail("timeout", "did not decide within %v", timeout)
	}
}

func appendUnique(s []string, add ...string) []string {
	for _, a := range add {
		found := false
		for _, x := range s {
			if x == a {
				found = true
				break
			}
		}
		if !found {
			s = append(s, a)
		}
	}
	return s
}
