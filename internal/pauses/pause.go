package pauses

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/broker"
)

// Scope is what a pause stops: the calls of a capability, of a principal, of
// an actor, or those that match every field set. The zero Scope is
// everything.
type Scope struct {
	// Capability is a capability id.
	Capability string `json:"capability,omitempty"`
	// Principal is a principal's name (broker.Anonymous on an open server).
	Principal string `json:"principal,omitempty"`
	// Actor is kind:id, as a grant names actors.
	Actor string `json:"actor,omitempty"`
}

// Everything reports whether the scope is the whole deployment.
func (s Scope) Everything() bool { return s == Scope{} }

// Validate reports what is wrong with the scope, naming the flag.
func (s Scope) Validate() error {
	var errs []error
	if s.Capability != "" {
		if err := envelope.ValidCapabilityID(s.Capability); err != nil {
			errs = append(errs, fmt.Errorf("capability %q: %w", s.Capability, err))
		}
	}
	if s.Principal != "" && !broker.ValidPrincipal(s.Principal) {
		errs = append(errs, fmt.Errorf("principal %q: want [a-z][a-z0-9_-]*, at most 64 bytes", s.Principal))
	}
	if s.Actor != "" {
		kind, id, ok := strings.Cut(s.Actor, ":")
		switch {
		case !ok || kind == "":
			errs = append(errs, fmt.Errorf("actor %q: want kind:id (user:alice, agent:refund-bot)", s.Actor))
		case kind != envelope.ActorAnonymous && id == "":
			errs = append(errs, fmt.Errorf("actor %q: an id after the kind", s.Actor))
		case strings.ContainsAny(s.Actor, "*>"):
			errs = append(errs, fmt.Errorf("actor %q: one actor, no wildcard (pause the principal to stop all its actors)", s.Actor))
		}
	}
	return errors.Join(errs...)
}

// Key is the scope's key in the pauses bucket: "all" for everything, else a
// hash of the scope (an actor's id is any printable text, which a key may
// not hold). One scope has one key: pausing it again replaces its pause.
func (s Scope) Key() string {
	if s.Everything() {
		return "all"
	}
	h := sha256.Sum256([]byte("c=" + s.Capability + "\np=" + s.Principal + "\na=" + s.Actor))
	return "s." + hex.EncodeToString(h[:16])
}

// String says the scope for a person: "email.send", "principal acme",
// "email.send of principal acme for actor user:bob", "everything".
func (s Scope) String() string {
	if s.Everything() {
		return "everything"
	}
	var parts []string
	if s.Capability != "" {
		parts = append(parts, s.Capability)
	} else {
		parts = append(parts, "every capability")
	}
	if s.Principal != "" {
		parts = append(parts, "of principal "+s.Principal)
	}
	if s.Actor != "" {
		parts = append(parts, "for actor "+s.Actor)
	}
	return strings.Join(parts, " ")
}

// Flags is the scope as the command's flags say it, to undo it.
func (s Scope) Flags() string {
	if s.Everything() {
		return "--all"
	}
	var parts []string
	if s.Capability != "" {
		parts = append(parts, s.Capability)
	}
	if s.Principal != "" {
		parts = append(parts, "--principal "+s.Principal)
	}
	if s.Actor != "" {
		parts = append(parts, "--actor "+s.Actor)
	}
	return strings.Join(parts, " ")
}

// Matches reports whether a call of capabilityID by principal, as actor, is
// in the scope.
func (s Scope) Matches(principal, capabilityID string, actor envelope.Actor) bool {
	if s.Capability != "" && s.Capability != capabilityID {
		return false
	}
	if s.Principal != "" && s.Principal != principal {
		return false
	}
	if s.Actor != "" {
		kind, id, _ := strings.Cut(s.Actor, ":")
		if kind != actor.Kind || id != actor.ID {
			return false
		}
	}
	return true
}

// Mode is what a pause does to the calls it matches.
type Mode string

const (
	// Hold keeps them in their queue, where they keep their start deadline,
	// and runs them once the pause is lifted.
	Hold Mode = "hold"
	// Refuse ends them at once, failed with the code PAUSED and the
	// operator's reason, which the model sees.
	Refuse Mode = "refuse"
)

// Pause is one operator's stop, as the bucket holds it.
type Pause struct {
	// V is the record's schema version.
	V int `json:"v"`
	// Scope is what it stops.
	Scope Scope `json:"scope"`
	// Mode is what becomes of the calls it matches.
	Mode Mode `json:"mode"`
	// Reason is why, in the operator's words: on the trail, in every
	// listing, and in the error a refused call ends with.
	Reason string `json:"reason"`
	// By is the principal that paused (the server authenticated it), and
	// Operator the person at its keyboard, as the command or the console
	// knew them.
	By       string `json:"by"`
	Operator string `json:"operator,omitempty"`
	// At is when it was paused.
	At time.Time `json:"at"`
	// CancelRunning asked every worker to cancel the running attempts it
	// matches, as their callers' cancels do.
	CancelRunning bool `json:"cancelRunning,omitempty"`
	// AuditID is the id under which the trail holds the pause
	// (capstan audit ID --owner BY).
	AuditID string `json:"auditId"`
}

// MaxReason bounds a reason: it travels in every refused call's error.
const MaxReason = 500

// Validate reports what is wrong with the pause.
func (p *Pause) Validate() error {
	var errs []error
	if err := p.Scope.Validate(); err != nil {
		errs = append(errs, err)
	}
	if p.Mode != Hold && p.Mode != Refuse {
		errs = append(errs, fmt.Errorf("mode %q: want hold or refuse", p.Mode))
	}
	if strings.TrimSpace(p.Reason) == "" {
		errs = append(errs, errors.New("a reason is required: it goes on the trail and to every caller refused"))
	}
	if len(p.Reason) > MaxReason {
		errs = append(errs, fmt.Errorf("reason: at most %d bytes", MaxReason))
	}
	return errors.Join(errs...)
}

// Refusal is the error a call the pause refuses ends with: exposed to the
// model, with the operator's reason, and retryable (once the pause is
// lifted, the same call runs).
func (p *Pause) Refusal() *envelope.CapabilityError {
	return &envelope.CapabilityError{Code: envelope.CodePaused, Stage: envelope.StageControls, ExposeToModel: true,
		Retryable: true, Message: "Paused by an operator: " + p.Reason + ". Not run; try again once it is lifted."}
}

// Data is what a call's trail says of the pause that held or refused it.
func (p *Pause) Data() map[string]any {
	return map[string]any{"pause": p.Scope.String(), "mode": string(p.Mode), "reason": p.Reason, "pausedBy": p.By,
		"pauseAuditId": p.AuditID}
}

// Set is the pauses a worker has loaded, read-only once made. A nil Set
// has no pause.
type Set struct {
	pauses []*Pause // by key
}

// NewSet makes a set of the pauses, which it keeps; nil when there is none.
func NewSet(ps []*Pause) *Set {
	if len(ps) == 0 {
		return nil
	}
	ps = slices.Clone(ps)
	slices.SortFunc(ps, func(a, b *Pause) int { return strings.Compare(a.Scope.Key(), b.Scope.Key()) })
	return &Set{pauses: ps}
}

// Match returns the pause that stops a call of capabilityID by principal as
// actor, nil when none does. A pause that refuses wins over one that
// holds.
func (s *Set) Match(principal, capabilityID string, actor envelope.Actor) *Pause {
	if s == nil {
		return nil
	}
	var held *Pause
	for _, p := range s.pauses {
		if !p.Scope.Matches(principal, capabilityID, actor) {
			continue
		}
		if p.Mode == Refuse {
			return p
		}
		if held == nil {
			held = p
		}
	}
	return held
}

// All returns the pauses, by key.
func (s *Set) All() []*Pause {
	if s == nil {
		return nil
	}
	return slices.Clone(s.pauses)
}

// Len is how many pauses the set holds.
func (s *Set) Len() int {
	if s == nil {
		return 0
	}
	return len(s.pauses)
}
