package executor

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/capstan-dev/capstan/envelope"
)

// Registry is a validated, immutable set of capabilities.
type Registry struct {
	byID map[string]*binding
	ids  []string
}

// RegistryError lists every problem of every capability found at build.
type RegistryError struct {
	// Problems are the messages, each naming its capability.
	Problems []string
}

// Error lists every problem, one a line.
func (e *RegistryError) Error() string {
	return fmt.Sprintf("capstan: %d problem(s) in the capability registry:\n  - %s",
		len(e.Problems), strings.Join(e.Problems, "\n  - "))
}

// NewRegistry validates every capability and returns the registry, or one
// *RegistryError listing all problems of all capabilities at once.
func NewRegistry(caps ...Capability) (*Registry, error) {
	r := &Registry{byID: make(map[string]*binding, len(caps))}
	var problems []string
	for i, c := range caps {
		if c == nil {
			problems = append(problems, fmt.Sprintf("capability #%d is nil", i))
			continue
		}
		b := c.binding()
		for _, p := range validate(b) {
			problems = append(problems, fmt.Sprintf("%s: %s", displayID(b.id, i), p))
		}
		if _, dup := r.byID[b.id]; dup && b.id != "" {
			problems = append(problems, fmt.Sprintf("%s: defined twice", b.id))
			continue
		}
		r.byID[b.id] = b
		r.ids = append(r.ids, b.id)
	}
	if len(problems) > 0 {
		return nil, &RegistryError{Problems: problems}
	}
	sort.Strings(r.ids)
	return r, nil
}

func displayID(id string, i int) string {
	if id == "" {
		return fmt.Sprintf("capability #%d", i)
	}
	return id
}

func validate(b *binding) []string {
	var p []string
	m := b.meta
	if err := envelope.ValidCapabilityID(b.id); err != nil {
		p = append(p, err.Error())
	}
	if b.invoke == nil {
		p = append(p, "no handler")
	}
	if strings.TrimSpace(m.Description) == "" {
		p = append(p, "description is empty: a model chooses tools by it")
	}
	switch m.SideEffect {
	case SideEffectNone, SideEffectRead, SideEffectWrite, SideEffectDestructive, SideEffectExternal:
	case "":
		p = append(p, "sideEffect is not declared (none, read, write, destructive or external)")
	default:
		p = append(p, fmt.Sprintf("sideEffect %q is not one of none, read, write, destructive, external", m.SideEffect))
	}
	switch m.Risk {
	case "", RiskLow, RiskMedium, RiskHigh, RiskCritical:
	default:
		p = append(p, fmt.Sprintf("risk %q is not one of low, medium, high, critical", m.Risk))
	}
	if len(m.Expose) == 0 {
		// Deny by default (SI-1): such a capability is served and every
		// call of it ends CAPABILITY_NOT_FOUND.
		p = append(p, "exposed on no surface, so no call can reach it: set Expose, e.g. executor.On(executor.SurfaceDirect, executor.SurfaceMCP)")
	}
	for _, s := range m.Expose {
		if s == "" || strings.ContainsAny(string(s), " .*>") {
			p = append(p, fmt.Sprintf("exposure surface %q is not a plain name", s))
		}
	}
	if m.Timeout < 0 {
		p = append(p, fmt.Sprintf("timeout %v is negative", m.Timeout))
	}
	if r := m.Retry; r != nil {
		if r.MaxAttempts < 0 {
			p = append(p, fmt.Sprintf("retry.maxAttempts %d is negative", r.MaxAttempts))
		}
		if r.Backoff < 0 {
			p = append(p, fmt.Sprintf("retry.backoff %v is negative", r.Backoff))
		}
		if r.MaxAttempts > 0 && m.SideEffect.writeLike() && !m.Idempotent {
			p = append(p, fmt.Sprintf("retry is configured on a %s capability that is not declared idempotent (SI-11): declare idempotent: true and deduplicate with the idempotency key, or remove retry", m.SideEffect))
		}
	}
	if a := m.Approval; a != nil && a.TTL < 0 {
		p = append(p, fmt.Sprintf("approval.ttl %v is negative", a.TTL))
	}
	for i, pol := range m.Policies {
		if pol.Evaluate == nil {
			p = append(p, fmt.Sprintf("policy #%d %q has no Evaluate function", i, pol.Name))
		}
	}
	p = append(p, validateLimits(m.Limits)...)
	if b.inType != nil && b.inType.Kind() == 0 {
		p = append(p, "input type is invalid")
	}
	p = append(p, b.recoveryProblems...)
	return p
}

// IDs lists the capability ids, sorted.
func (r *Registry) IDs() []string { return slices.Clone(r.ids) }

// Lookup returns a capability's metadata.
func (r *Registry) Lookup(id string) (Meta, bool) {
	b, ok := r.byID[id]
	if !ok {
		return Meta{}, false
	}
	return b.meta, true
}

func (r *Registry) get(id string) *binding { return r.byID[id] }

// ErrEmptyRegistry is returned by NewWorker for a registry without capabilities.
var ErrEmptyRegistry = errors.New("capstan: the registry has no capabilities")
