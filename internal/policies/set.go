package policies

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	cedar "github.com/cedar-policy/cedar-go"
	xast "github.com/cedar-policy/cedar-go/x/exp/ast"
	"github.com/cedar-policy/cedar-go/x/exp/schema"
	"github.com/cedar-policy/cedar-go/x/exp/schema/validate"

	"github.com/capstan-dev/capstan/envelope"
)

// MaxText bounds a policy set's text.
const MaxText = 256 << 10

// Set is a compiled Cedar policy set: a version of the bucket, as a worker
// evaluates it. A Set is read-only once made and safe for concurrent use.
type Set struct {
	// Version is its version in the bucket (0: not applied yet).
	Version int
	// SHA256 is the hex SHA-256 of its text.
	SHA256 string

	ps    *cedar.PolicySet
	names map[cedar.PolicyID]string
	// readsContext: some policy reads the context, which then is built
	// (the input converted) for each call; otherwise it never is.
	readsContext bool
	// broken: the version could not be loaded; every decision fails closed.
	broken error
	// entities of each capability asked about: its own and its action's.
	entities sync.Map // capability id → *capabilityEntities
}

// Compile parses text, a policy set in the Cedar language, named file in
// its errors. Every policy is named by its @id("…") annotation, or
// policyN (its place in the text, from 0), and its line.
func Compile(file string, text []byte) (*Set, error) {
	if len(text) > MaxText {
		return nil, fmt.Errorf("%s: %d bytes, at most %d", file, len(text), MaxText)
	}
	ps, err := cedar.NewPolicySetFromBytes(file, text)
	if err != nil {
		return nil, fmt.Errorf("%s does not parse: %w", file, err)
	}
	sum := sha256.Sum256(text)
	s := &Set{SHA256: hex.EncodeToString(sum[:]), ps: ps, names: map[cedar.PolicyID]string{}}
	seen := map[string]cedar.PolicyID{}
	for id, p := range ps.All() {
		name := string(id)
		if n, ok := p.Annotations()["id"]; ok && n != "" {
			name = string(n)
		}
		if other, dup := seen[name]; dup {
			return nil, fmt.Errorf("%s: two policies are named %q (%s and %s): give each its own @id", file, name, other, id)
		}
		seen[name] = id
		s.names[id] = name
		if bytes.Contains(p.MarshalCedar(), []byte("context")) {
			s.readsContext = true
		}
	}
	if len(s.names) == 0 {
		return nil, fmt.Errorf("%s holds no policy: to put none in force, remove the set instead", file)
	}
	return s, nil
}

// Broken is a version that could not be loaded: every call it decides is
// refused, POLICY_FAILED, naming the version and err.
func Broken(version int, err error) *Set { return &Set{Version: version, broken: err} }

// Err is why the set is broken, nil when it is not.
func (s *Set) Err() error { return s.broken }

// Rules is how many policies the set holds.
func (s *Set) Rules() int { return len(s.names) }

// Names lists the set's policies by name, sorted.
func (s *Set) Names() []string {
	out := make([]string, 0, len(s.names))
	for _, n := range s.names {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// name is a policy's name and line, as decisions give it.
func (s *Set) name(id cedar.PolicyID) string {
	n := s.names[id]
	if p := s.ps.Get(id); p != nil && p.Position().Line > 0 {
		return fmt.Sprintf("%s (line %d)", n, p.Position().Line)
	}
	return n
}

// Validate checks every policy against the Cedar schema of caps (Schema):
// its entity types, its actions (capabilities the catalog lists), the
// attributes and context fields it reads and their types. Every problem is
// reported, joined.
func (s *Set) Validate(caps []Capability) error {
	var sch schema.Schema
	if err := sch.UnmarshalCedar([]byte(Schema(caps))); err != nil {
		return fmt.Errorf("the catalog's schema: %w", err)
	}
	rs, err := sch.Resolve()
	if err != nil {
		return fmt.Errorf("the catalog's schema: %w", err)
	}
	v := validate.New(rs)
	var errs []error
	ids := make([]cedar.PolicyID, 0, len(s.names))
	for id := range s.names {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		p := s.ps.Get(id)
		if err := v.Policy(string(id), (*xast.Policy)(p.AST())); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", s.name(id), err))
		}
	}
	return errors.Join(errs...)
}

// Request is one call as a policy sees it.
type Request struct {
	// Principal is the NATS principal the call came from.
	Principal string
	// Actor is who it runs for.
	Actor envelope.Actor
	// Capability is the capability called.
	Capability *Capability
	// Surface is where it came from.
	Surface string
	// Input is the validated input: a Go value as JSON encodes it, or
	// JSON itself (json.RawMessage); nil when not known (a recorded
	// execution: the trail keeps only its hash).
	Input any
}

// Decision is what the set says of a call.
type Decision struct {
	// Allow: a permit matched and no forbid did.
	Allow bool `json:"allow"`
	// Policy names the policies that decided a denial (the forbids that
	// matched, or the one that could not be evaluated); empty when no
	// policy permits the call.
	Policy string `json:"policy,omitempty"`
	// Reason says why, for the trail and operators, never the model.
	Reason string `json:"reason"`
	// Failed: a policy could not be evaluated, and the call is refused for
	// it (fail closed).
	Failed bool `json:"failed,omitempty"`
	// Version is the set's version.
	Version int `json:"version"`
}

// Decide evaluates the set for r. Every outcome but a permit is a denial: a
// forbid that matched (whatever else could not be evaluated), a policy that
// could not be evaluated (an error, or a field of the input it reads that
// the call lacks: it fails closed), or no permit that matched.
func (s *Set) Decide(r Request) (d Decision) {
	d.Version = s.Version
	if s.broken != nil {
		return Decision{Failed: true, Version: s.Version, Reason: fmt.Sprintf("policy set v%d could not be loaded: %v", s.Version, s.broken)}
	}
	defer func() {
		if p := recover(); p != nil {
			d = Decision{Failed: true, Version: s.Version, Reason: fmt.Sprintf("policy set v%d panicked: %v", s.Version, p)}
		}
	}()
	ents, req := s.request(r)
	decision, diag := cedar.Authorize(s.ps, ents, req)
	if decision == cedar.Deny && len(diag.Reasons) > 0 {
		// A forbid matched: denied, whatever else could not be evaluated.
		d.Policy = s.reasons(diag.Reasons)
		d.Reason = "forbidden by " + d.Policy
		return d
	}
	if len(diag.Errors) > 0 {
		names := make([]string, 0, len(diag.Errors))
		msgs := make([]string, 0, len(diag.Errors))
		for _, e := range diag.Errors {
			names = append(names, s.name(e.PolicyID))
			msgs = append(msgs, s.names[e.PolicyID]+": "+e.Message)
		}
		slices.Sort(names)
		slices.Sort(msgs)
		d.Failed, d.Policy = true, strings.Join(names, ", ")
		d.Reason = "could not be evaluated: " + strings.Join(msgs, "; ")
		return d
	}
	if decision == cedar.Allow {
		d.Allow, d.Reason = true, "permitted by "+s.reasons(diag.Reasons)
		return d
	}
	d.Reason = "no policy permits it"
	return d
}

func (s *Set) reasons(rs []cedar.DiagnosticReason) string {
	names := make([]string, 0, len(rs))
	for _, r := range rs {
		names = append(names, s.name(r.PolicyID))
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

// capabilityEntities are a capability's entity and its action's.
type capabilityEntities struct {
	capability, action cedar.Entity
}

var callUID = cedar.NewEntityUID(actionType, callAction)

// capability returns c's entities, made once per set.
func (s *Set) capability(c *Capability) *capabilityEntities {
	if e, ok := s.entities.Load(c.ID); ok {
		return e.(*capabilityEntities)
	}
	tags := make([]cedar.Value, len(c.Tags))
	for i, t := range c.Tags {
		tags[i] = cedar.String(t)
	}
	e := &capabilityEntities{
		capability: cedar.Entity{UID: cedar.NewEntityUID(capabilityType, cedar.String(c.ID)),
			Attributes: cedar.NewRecord(cedar.RecordMap{"sideEffect": cedar.String(c.SideEffect), "risk": cedar.String(c.Risk),
				"idempotent": cedar.Boolean(c.Idempotent), "tags": cedar.NewSet(tags...)})},
		action: cedar.Entity{UID: cedar.NewEntityUID(actionType, cedar.String(c.ID)), Parents: cedar.NewEntityUIDSet(callUID)},
	}
	actual, _ := s.entities.LoadOrStore(c.ID, e)
	return actual.(*capabilityEntities)
}

// entities are the entities of one request: no map is made for them.
type entities struct {
	principal, actor cedar.Entity
	c                *capabilityEntities
}

// Get returns the entity uid names, if the request has it.
func (e *entities) Get(uid cedar.EntityUID) (cedar.Entity, bool) {
	switch uid {
	case e.actor.UID:
		return e.actor, true
	case e.principal.UID:
		return e.principal, true
	case e.c.capability.UID:
		return e.c.capability, true
	case e.c.action.UID:
		return e.c.action, true
	case callUID:
		return cedar.Entity{UID: callUID}, true
	}
	return cedar.Entity{}, false
}

// request is r as Cedar asks it.
func (s *Set) request(r Request) (*entities, cedar.Request) {
	c := s.capability(r.Capability)
	pUID := cedar.NewEntityUID(principalType, cedar.String(r.Principal))
	aUID := cedar.NewEntityUID(actorType(r.Actor.Kind), cedar.String(r.Actor.ID))
	actor := cedar.Entity{UID: aUID, Parents: cedar.NewEntityUIDSet(pUID)}
	if len(r.Actor.Attrs) > 0 {
		tags := make(cedar.RecordMap, len(r.Actor.Attrs))
		for k, v := range r.Actor.Attrs {
			tags[cedar.String(k)] = cedar.String(v)
		}
		actor.Tags = cedar.NewRecord(tags)
	}
	ents := &entities{principal: cedar.Entity{UID: pUID}, actor: actor, c: c}
	req := cedar.Request{Principal: aUID, Action: c.action.UID, Resource: c.capability.UID}
	if s.readsContext {
		ctx := cedar.RecordMap{"surface": cedar.String(r.Surface)}
		if in, ok := inputValue(r.Input, r.Capability.InputSchema); ok {
			ctx["input"] = in
		}
		req.Context = cedar.NewRecord(ctx)
	}
	return ents, req
}

// inputValue is the input as a Cedar value, typed by the input's schema.
func inputValue(in any, sch map[string]any) (cedar.Value, bool) {
	if in == nil || cedarType(sch) == "" {
		return nil, false
	}
	raw, ok := in.(json.RawMessage)
	if !ok {
		var err error
		if raw, err = json.Marshal(in); err != nil {
			return nil, false
		}
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, false
	}
	return value(v, sch)
}
