package auth

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/broker"
)

// Role says what a principal may do.
type Role string

const (
	// RoleProducer submits requests, awaits and reads its own results, cancels its
	// own executions and asks what it may call.
	RoleProducer Role = "producer"
	// RoleApprover lists and decides the approvals of its types, through the workers.
	RoleApprover Role = "approver"
	// RoleWorker serves a pool's capabilities and writes records, envelopes,
	// approvals, the catalog and the audit trail.
	RoleWorker Role = "worker"
	// RoleAdmin provisions resources and writes grants.
	RoleAdmin Role = "admin"
	// RoleNotifier reads the approvals' changes through the notify consumers and
	// tells approvers in Slack, by email or a webhook (package notify). It
	// writes nothing.
	RoleNotifier Role = "notifier"
)

// allRoles lists every role.
var allRoles = []Role{RoleProducer, RoleApprover, RoleWorker, RoleAdmin, RoleNotifier}

// Grant is what one principal may do. Workers check a producer's actor,
// surface and capability against it before anything runs, and an approver's
// types before a decision is recorded.
type Grant struct {
	// V is the grant's schema version.
	V int `json:"v"`
	// Principal is the NATS user's name and the token of every subject it
	// publishes to.
	Principal string `json:"principal"`
	// Role says what kind of principal it is: producer, approver, worker
	// or admin.
	Role Role `json:"role"`
	// PublicKey is the principal's NATS user key.
	PublicKey string `json:"publicKey,omitempty"`
	// Actors the principal may act as: "kind:id", or "kind:*" for a gateway
	// that authenticates its own end users. A producer needs at least one; an
	// approver's first actor is the identity its decisions carry.
	Actors []string `json:"actors,omitempty"`
	// Surfaces a producer may call from; empty means every surface.
	Surfaces []string `json:"surfaces,omitempty"`
	// Capabilities a producer may call: ids, or prefixes ending in ".*"
	// ("orders.*"); "*" is every capability. Empty means none.
	Capabilities []string `json:"capabilities,omitempty"`
	// Types of approvals an approver may decide; "*" is every type.
	Types []string `json:"types,omitempty"`
	// Pool a worker serves (informational: workers are trusted).
	Pool string `json:"pool,omitempty"`
	// Account is the public key of a producer's or approver's own account
	// (DESIGN §12 "Accounts per principal"); empty for admins and workers,
	// users of the capstan account.
	Account string `json:"account,omitempty"`
	// AccountJWT is that account, signed by the operator: what Push sends
	// the servers. It is kept in the setup, never in the grants bucket.
	AccountJWT string `json:"accountJwt,omitempty"`
	// Limits of the principal's own account (nil at Add: DefaultLimits).
	Limits *Limits `json:"limits,omitempty"`
	// Quotas of a producer or approver (nil: DefaultQuotas), which workers
	// enforce (DESIGN §12 "Quotas").
	Quotas *Quotas `json:"quotas,omitempty"`
}

// Errors of Grant checks, wrapped with the missing right.
var (
	errActorNotGranted      = errors.New("actor not granted")
	errSurfaceNotGranted    = errors.New("surface not granted")
	ErrCapabilityNotGranted = errors.New("capability not granted")
	errTypeNotGranted       = errors.New("approval type not granted")
	errWrongRole            = errors.New("role does not allow it")
)

// Validate reports every problem of g at once.
func (g Grant) Validate() error {
	var errs []error
	if !broker.ValidPrincipal(g.Principal) || g.Principal == broker.Anonymous {
		errs = append(errs, fmt.Errorf("principal %q: want [a-z][a-z0-9_-]*, at most 64 bytes", g.Principal))
	}
	if !slices.Contains(allRoles, g.Role) {
		errs = append(errs, fmt.Errorf("role %q: want one of producer, approver, worker, admin, notifier", g.Role))
	}
	for _, a := range g.Actors {
		kind, id, ok := strings.Cut(a, ":")
		if !ok || kind == "" || id == "" || strings.Contains(kind, "*") || (strings.Contains(id, "*") && id != "*") {
			errs = append(errs, fmt.Errorf("actor %q: want kind:id or kind:*", a))
		}
	}
	for _, c := range g.Capabilities {
		if c == "*" {
			continue
		}
		if err := envelope.ValidCapabilityID(strings.TrimSuffix(c, ".*")); err != nil {
			errs = append(errs, fmt.Errorf("capability %q: want an id, a prefix ending in .*, or *", c))
		}
	}
	for _, s := range g.Surfaces {
		if s == "" || strings.ContainsAny(s, " *>.") {
			errs = append(errs, fmt.Errorf("surface %q", s))
		}
	}
	if g.Role == RoleProducer && len(g.Actors) == 0 {
		errs = append(errs, errors.New("a producer needs --actor (kind:id, or kind:* for a gateway)"))
	}
	if g.Role == RoleApprover && len(g.Types) == 0 {
		errs = append(errs, errors.New("an approver needs --types (approval types it may decide, or *)"))
	}
	if g.Limits != nil {
		if !HasOwnAccount(g.Role) {
			errs = append(errs, fmt.Errorf("limits: a %s lives in the capstan account, which has none of its own", g.Role))
		} else if err := g.Limits.validate(); err != nil {
			errs = append(errs, err)
		}
	}
	if g.Quotas != nil {
		if !HasOwnAccount(g.Role) {
			errs = append(errs, fmt.Errorf("quotas: a %s is trusted with the capstan account and has none", g.Role))
		} else if err := g.Quotas.validate(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// checkActor returns nil when the principal may act as a, else an error naming
// the missing right.
func (g Grant) checkActor(a envelope.Actor) error {
	if g.Role != RoleProducer {
		return fmt.Errorf("%w: principal %q is a %s, not a producer", errWrongRole, g.Principal, g.Role)
	}
	for _, p := range g.Actors {
		kind, id, _ := strings.Cut(p, ":")
		if kind == a.Kind && (id == "*" || id == a.ID) {
			return nil
		}
	}
	return fmt.Errorf("%w: principal %q may not act as %s:%s (granted %s)", errActorNotGranted,
		g.Principal, a.Kind, a.ID, strings.Join(g.Actors, ","))
}

// checkSurface returns nil when the principal may call from surface.
func (g Grant) checkSurface(surface string) error {
	if len(g.Surfaces) == 0 || slices.Contains(g.Surfaces, surface) {
		return nil
	}
	return fmt.Errorf("%w: principal %q may not call from surface %q (granted %s)", errSurfaceNotGranted,
		g.Principal, surface, strings.Join(g.Surfaces, ","))
}

// checkCapability returns nil when the principal may call capabilityID.
func (g Grant) checkCapability(capabilityID string) error {
	if g.AllowsCapability(capabilityID) {
		return nil
	}
	return fmt.Errorf("%w: principal %q may not call %q", ErrCapabilityNotGranted, g.Principal, capabilityID)
}

// AllowsCapability reports whether capabilityID is within the grant.
func (g Grant) AllowsCapability(capabilityID string) bool {
	for _, c := range g.Capabilities {
		if c == "*" || c == capabilityID {
			return true
		}
		if p, ok := strings.CutSuffix(c, ".*"); ok && strings.HasPrefix(capabilityID, p+".") {
			return true
		}
	}
	return false
}

// checkTypes returns nil when an approver may decide an approval of types:
// every type must be granted (an approval without types needs "*").
func (g Grant) checkTypes(types []string) error {
	if g.Role != RoleApprover && g.Role != RoleAdmin {
		return fmt.Errorf("%w: principal %q is a %s, not an approver", errWrongRole, g.Principal, g.Role)
	}
	if g.Role == RoleAdmin || slices.Contains(g.Types, "*") {
		return nil
	}
	if len(types) == 0 {
		return fmt.Errorf("%w: principal %q may decide approvals of types %s, this one has none", errTypeNotGranted,
			g.Principal, strings.Join(g.Types, ","))
	}
	for _, t := range types {
		if !slices.Contains(g.Types, t) {
			return fmt.Errorf("%w: principal %q may not decide approvals of type %q", errTypeNotGranted, g.Principal, t)
		}
	}
	return nil
}

// identity is the actor an approver's decisions carry: its first granted
// actor, else service:<principal>.
func (g Grant) identity() envelope.Actor {
	if len(g.Actors) > 0 {
		kind, id, _ := strings.Cut(g.Actors[0], ":")
		if id != "*" {
			return envelope.Actor{Kind: kind, ID: id}
		}
	}
	return envelope.Actor{Kind: envelope.ActorService, ID: g.Principal}
}

// CheckCall decides stage 6 for a call g's principal makes as actor from
// surface: nil, or a CapabilityError FORBIDDEN whose cause names the missing
// right (the actor, the surface or the capability). Actor well-formedness is
// checked before.
func (g Grant) CheckCall(actor envelope.Actor, surface, capabilityID string) error {
	for _, check := range []struct {
		right string
		err   error
	}{
		{"this actor", g.checkActor(actor)},
		{"this surface", g.checkSurface(surface)},
		{"this capability", g.checkCapability(capabilityID)},
	} {
		if check.err != nil {
			return &envelope.CapabilityError{Code: envelope.CodeForbidden, Stage: envelope.StageActor,
				Message: "Not allowed: the caller has no grant for " + check.right + ".", ExposeToModel: true, Cause: check.err}
		}
	}
	return nil
}

// ApproverFor returns the identity g's decisions carry, if g may decide an
// approval of types: every type must be granted (an approval without types
// needs "*"); an admin decides any.
func (g Grant) ApproverFor(types []string) (envelope.Actor, error) {
	if err := g.checkTypes(types); err != nil {
		return envelope.Actor{}, err
	}
	return g.identity(), nil
}
