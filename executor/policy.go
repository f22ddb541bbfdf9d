package executor

import (
	"context"
	"fmt"
	"time"

	"github.com/capstan-dev/capstan/envelope"
)

// Phase is when a policy is evaluated.
type Phase string

// Phases.
const (
	// PhaseDiscovery: while describing capabilities to a caller.
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
	Deny            Stance = "deny"
	Hide            Stance = "hide"
	RequireApproval Stance = "require-approval"
	Allow           Stance = "allow"
)

func (s Stance) rank() int {
	switch s {
	case Deny:
		return 3
	case Hide:
		return 2
	case RequireApproval:
		return 1
	}
	return 0
}

// Decision is one policy's stance with its reason.
type Decision struct {
	Stance Stance
	Reason string
	// ApprovalTypes name the kinds of approval required (with RequireApproval).
	ApprovalTypes []string
}

// PolicyRequest is what a policy sees: the validated input, never raw bytes.
type PolicyRequest struct {
	Phase        Phase
	CapabilityID string
	Meta         Meta
	Actor        envelope.Actor
	Surface      Surface
	// Input is a pointer to the capability's validated input type (nil in the
	// discovery phase).
	Input any
}

// Policy decides whether a call may go on. Evaluate must be quick and must not
// have effects; one that errors, panics or outlives the policy timeout fails
// closed.
type Policy struct {
	Name string
	// Phases it applies to; empty means invocation only.
	Phases   []Phase
	Evaluate func(ctx context.Context, r PolicyRequest) (Decision, error)
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
	Policy string `json:"policy"`
	Stance Stance `json:"stance"`
	Reason string `json:"reason,omitempty"`
	Failed bool   `json:"failed,omitempty"`
}

// verdict merges every stance of one phase.
type verdict struct {
	stance        Stance
	failed        bool // a policy failed closed
	reasons       []string
	approvalTypes []string
	records       []PolicyRecord
}

// DefaultPolicyTimeout bounds one policy's evaluation.
const DefaultPolicyTimeout = time.Second

// evaluatePolicies runs every applicable policy (no short-circuit) and merges
// them by precedence. A policy that errors, panics or times out counts as deny
// and marks the verdict failed.
func evaluatePolicies(ctx context.Context, policies []Policy, r PolicyRequest, timeout time.Duration) verdict {
	v := verdict{stance: Allow}
	for _, p := range policies {
		if !p.appliesTo(r.Phase) {
			continue
		}
		d, err := runPolicy(ctx, p, r, timeout)
		rec := PolicyRecord{Policy: p.Name, Stance: d.Stance, Reason: d.Reason}
		if err != nil {
			rec.Stance, rec.Failed, rec.Reason = Deny, true, err.Error()
			v.failed = true
			d = Decision{Stance: Deny, Reason: err.Error()}
		}
		if d.Stance == "" {
			d.Stance = Allow
			rec.Stance = Allow
		}
		v.records = append(v.records, rec)
		if d.Stance.rank() > v.stance.rank() {
			v.stance = d.Stance
		}
		if d.Stance != Allow && d.Reason != "" {
			v.reasons = append(v.reasons, d.Reason)
		}
		if d.Stance == RequireApproval {
			v.approvalTypes = appendUnique(v.approvalTypes, d.ApprovalTypes...)
		}
	}
	return v
}

func runPolicy(ctx context.Context, p Policy, r PolicyRequest, timeout time.Duration) (d Decision, err error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	type result struct {
		d   Decision
		err error
	}
	ch := make(chan result, 1)
	go func() {
		defer func() {
			if rec := recover(); rec != nil {
				ch <- result{err: fmt.Errorf("policy %s panicked: %v", p.Name, rec)}
			}
		}()
		d, err := p.Evaluate(ctx, r)
		ch <- result{d, err}
	}()
	select {
	case res := <-ch:
		if res.err != nil {
			return Decision{}, fmt.Errorf("policy %s failed: %w", p.Name, res.err)
		}
		switch res.d.Stance {
		case "", Allow, Deny, Hide, RequireApproval:
		default:
			return Decision{}, fmt.Errorf("policy %s returned unknown stance %q", p.Name, res.d.Stance)
		}
		return res.d, nil
	case <-ctx.Done():
		return Decision{}, fmt.Errorf("policy %s did not decide within %v", p.Name, timeout)
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
