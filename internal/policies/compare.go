package policies

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/capstan-dev/capstan/envelope"
)

// Case is one call a policy set is tested against: one of a file of cases
// an operator writes, or an execution the trail recorded.
type Case struct {
	// Name names a case of a file.
	Name string `json:"name,omitempty"`
	// ExecutionID and Recorded are a recorded execution's id and outcome
	// (its status, and code when it failed).
	ExecutionID string `json:"executionId,omitempty"`
	Recorded    string `json:"recorded,omitempty"`
	// Principal, Actor (kind:id), ActorAttrs, Capability and Surface are
	// the call's; Input its input, as JSON. A recorded execution has no
	// input: the trail keeps its hash alone.
	Principal  string            `json:"principal"`
	Actor      string            `json:"actor"`
	ActorAttrs map[string]string `json:"actorAttrs,omitempty"`
	Capability string            `json:"capability"`
	Surface    string            `json:"surface,omitempty"`
	Input      json.RawMessage   `json:"input,omitempty"`
	// Expect is what the case says the set must decide: allow or deny
	// (empty: anything).
	Expect string `json:"expect,omitempty"`
}

// ReadCases reads a file of cases: a JSON array of Case.
func ReadCases(b []byte) ([]Case, error) {
	var cs []Case
	if err := json.Unmarshal(b, &cs); err != nil {
		return nil, fmt.Errorf("cases: want a JSON array of {name, principal, actor, capability, surface, input, expect}: %w", err)
	}
	var errs []error
	for i, c := range cs {
		if c.Capability == "" || c.Actor == "" {
			errs = append(errs, fmt.Errorf("case %d (%s): a capability and an actor (kind:id) are required", i, c.Name))
		}
		if c.Expect != "" && c.Expect != "allow" && c.Expect != "deny" {
			errs = append(errs, fmt.Errorf("case %d (%s): expect %q: want allow or deny", i, c.Name, c.Expect))
		}
	}
	return cs, errors.Join(errs...)
}

// Outcome is what two sets decide of one case.
type Outcome struct {
	Case Case `json:"case"`
	// Now is what the set in force decides (with none in force: allowed, as
	// today); With what the set tested decides.
	Now  Decision `json:"now"`
	With Decision `json:"with"`
	// Changed: the two decide differently (allow, deny, or cannot decide),
	// both knowing what they need.
	Changed bool `json:"changed"`
	// NeedsInput: a set could not decide without the call's input, which a
	// recorded execution lacks: whether its decision changes is unknown.
	NeedsInput bool `json:"needsInput,omitempty"`
	// Unexpected: the case expects another decision than With.
	Unexpected bool `json:"unexpected,omitempty"`
}

// Word is a decision in one word: allow, deny, or fail (cannot decide).
func (d Decision) Word() string {
	switch {
	case d.Allow:
		return "allow"
	case d.Failed:
		return "fail"
	}
	return "deny"
}

// Compare decides every case with now (nil: no set in force) and with,
// the capabilities as catalog describes them.
func Compare(now, with *Set, cases []Case, catalog []Capability) []Outcome {
	caps := make(map[string]*Capability, len(catalog))
	for i := range catalog {
		caps[catalog[i].ID] = &catalog[i]
	}
	out := make([]Outcome, 0, len(cases))
	for _, c := range cases {
		capability := caps[c.Capability]
		if capability == nil {
			// No longer (or not yet) in the catalog: a policy that reads
			// its attributes cannot decide.
			capability = &Capability{ID: c.Capability}
		}
		kind, id, _ := strings.Cut(c.Actor, ":")
		req := Request{Principal: c.Principal, Actor: envelope.Actor{Kind: kind, ID: id, Attrs: c.ActorAttrs},
			Capability: capability, Surface: c.Surface}
		if req.Surface == "" {
			req.Surface = "direct"
		}
		if len(c.Input) > 0 {
			req.Input = c.Input
		}
		o := Outcome{Case: c, With: with.Decide(req)}
		if now != nil {
			o.Now = now.Decide(req)
		} else {
			o.Now = Decision{Allow: true, Reason: "no Cedar policy in force"}
		}
		o.NeedsInput = len(c.Input) == 0 && (o.Now.Failed || o.With.Failed)
		o.Changed = !o.NeedsInput && o.Now.Word() != o.With.Word()
		o.Unexpected = c.Expect != "" && c.Expect != o.With.Word()
		out = append(out, o)
	}
	return out
}
