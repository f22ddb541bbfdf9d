package policies

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/capstan-dev/capstan/envelope"
)

// Two capabilities as the catalog describes them, their input schemas as
// executor's input check derives them.
var (
	emailSend = Capability{ID: "email.send", SideEffect: "external", Risk: "medium", Tags: []string{"demo"},
		InputSchema: map[string]any{"type": "object", "additionalProperties": false, "required": []any{"to", "subject"},
			"properties": map[string]any{
				"to":      map[string]any{"type": "string"},
				"subject": map[string]any{"type": "string"},
				"cc":      map[string]any{"type": "array", "items": map[string]any{"type": "string"}},
				"holdMs":  map[string]any{"type": "integer", "minimum": -1 << 63, "maximum": 1<<63 - 1},
				"sendAt":  map[string]any{"type": []any{"string", "null"}, "format": "date-time"},
				"extra":   map[string]any{"type": "object", "additionalProperties": map[string]any{"type": "string"}},
			}}}
	refund = Capability{ID: "orders.refund", SideEffect: "write", Risk: "high", Idempotent: true, Tags: []string{"payments"},
		InputSchema: map[string]any{"type": "object", "additionalProperties": false, "required": []any{"orderId", "amount"},
			"properties": map[string]any{
				"orderId": map[string]any{"type": "string"},
				"amount":  map[string]any{"type": "number"},
			}}}
	catalog = []Capability{emailSend, refund}
)

const tenRules = `
@id("everyone-calls")
permit (principal, action in Action::"call", resource);

@id("no-mail-to-competitors")
forbid (principal, action == Action::"email.send", resource)
when { context.input.to like "*@competitor.example" };

@id("no-bulk-cc")
forbid (principal, action == Action::"email.send", resource)
when { context.input has cc && context.input.cc.contains("all@example.com") };

@id("agents-refund-little")
forbid (principal is Agent, action == Action::"orders.refund", resource)
when { context.input.amount.greaterThan(decimal("100.0")) };

@id("no-destructive-from-mcp")
forbid (principal, action, resource)
when { context.surface == "mcp" && resource.sideEffect == "destructive" };

@id("contractors-no-payments")
forbid (principal, action, resource)
when { principal.hasTag("team") && principal.getTag("team") == "contractors" && resource.tags.contains("payments") };

@id("beta-no-mail")
forbid (principal in Principal::"beta", action == Action::"email.send", resource);

@id("mallory-nothing")
forbid (principal == User::"mallory", action, resource);

@id("no-late-mail")
forbid (principal, action == Action::"email.send", resource)
when { context.input has sendAt && context.input.sendAt > datetime("2030-01-01T00:00:00Z") };

@id("anonymous-reads-only")
forbid (principal is Anonymous, action, resource)
when { resource.sideEffect != "none" && resource.sideEffect != "read" };
`

func compile(t *testing.T, text string) *Set {
	t.Helper()
	s, err := Compile("test.cedar", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Validate(catalog); err != nil {
		t.Fatalf("does not validate: %v", err)
	}
	return s
}

func TestDecide_TenRules(t *testing.T) {
	t.Parallel()
	s := compile(t, tenRules)
	if s.Rules() != 10 {
		t.Fatalf("%d rules, want 10", s.Rules())
	}
	user := func(id string, attrs ...string) envelope.Actor {
		a := envelope.Actor{Kind: "user", ID: id}
		if len(attrs) == 2 {
			a.Attrs = map[string]string{attrs[0]: attrs[1]}
		}
		return a
	}
	agent := envelope.Actor{Kind: "agent", ID: "bot"}
	type in = map[string]any
	for _, tt := range []struct {
		name      string
		principal string
		actor     envelope.Actor
		cap       Capability
		surface   string
		input     any
		allow     bool
		policy    string
	}{
		{"a plain mail", "acme", user("alice"), emailSend, "direct", in{"to": "a@example.com", "subject": "hi"}, true, ""},
		{"a competitor's address", "acme", user("alice"), emailSend, "direct", in{"to": "x@competitor.example", "subject": "hi"}, false, "no-mail-to-competitors (line 5)"},
		{"cc to everyone", "acme", user("alice"), emailSend, "direct", in{"to": "a@example.com", "subject": "", "cc": []any{"all@example.com"}}, false, "no-bulk-cc (line 9)"},
		{"an agent's small refund", "acme", agent, refund, "mcp", in{"orderId": "o1", "amount": 99.5}, true, ""},
		{"an agent's large refund", "acme", agent, refund, "mcp", in{"orderId": "o1", "amount": 100.01}, false, "agents-refund-little (line 13)"},
		{"a user's large refund", "acme", user("alice"), refund, "mcp", in{"orderId": "o1", "amount": 5000}, true, ""},
		{"a contractor's refund", "acme", user("carl", "team", "contractors"), refund, "direct", in{"orderId": "o1", "amount": 1}, false, "contractors-no-payments (line 21)"},
		{"principal beta's mail", "beta", user("alice"), emailSend, "direct", in{"to": "a@example.com", "subject": "hi"}, false, "beta-no-mail (line 25)"},
		{"mallory", "acme", user("mallory"), refund, "direct", in{"orderId": "o1", "amount": 1}, false, "mallory-nothing (line 28)"},
		{"a late mail", "acme", user("alice"), emailSend, "direct", in{"to": "a@example.com", "subject": "hi", "sendAt": "2031-05-01T10:00:00Z"}, false, "no-late-mail (line 31)"},
		{"anonymous refund", "_anon", envelope.Actor{Kind: "anonymous"}, refund, "direct", in{"orderId": "o1", "amount": 1}, false, "anonymous-reads-only (line 35)"},
		{"raw JSON input", "acme", user("alice"), emailSend, "direct", json.RawMessage(`{"to":"x@competitor.example","subject":"hi"}`), false, "no-mail-to-competitors (line 5)"},
	} {
		c := tt.cap
		d := s.Decide(Request{Principal: tt.principal, Actor: tt.actor, Capability: &c, Surface: tt.surface, Input: tt.input})
		if d.Allow != tt.allow || d.Policy != tt.policy || d.Failed {
			t.Errorf("%s: %+v, want allow=%v by %q", tt.name, d, tt.allow, tt.policy)
		}
	}
}

// Nothing is permitted without a permit; a policy that reads an input field
// the call lacks fails the call closed, named; so does a broken version.
func TestDecide_DefaultDenyAndFailClosed(t *testing.T) {
	t.Parallel()
	c := emailSend
	req := Request{Principal: "acme", Actor: envelope.Actor{Kind: "user", ID: "alice"}, Capability: &c, Surface: "direct",
		Input: map[string]any{"to": "a@example.com", "subject": "hi"}}
	s := compile(t, `forbid (principal, action, resource) when { context.surface == "mcp" };`)
	if d := s.Decide(req); d.Allow || d.Failed || d.Policy != "" || d.Reason != "no policy permits it" {
		t.Errorf("no permit: %+v", d)
	}
	// A set validated against an earlier catalog, whose email.send required
	// holdMs: the validator would refuse it now (an optional field read
	// without "has"), and a call that lacks it fails closed.
	s, err := Compile("older.cedar", []byte(`permit (principal, action, resource);
@id("reads-holdMs") forbid (principal, action == Action::"email.send", resource) when { context.input.holdMs > 5 };`))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Validate(catalog); err == nil || !strings.Contains(err.Error(), "holdMs") {
		t.Fatalf("validates against today's catalog: %v", err)
	}
	if d := s.Decide(req); d.Allow || !d.Failed || !strings.HasPrefix(d.Policy, "reads-holdMs") {
		t.Errorf("a field the call lacks: %+v", d)
	}
	// A recorded execution, whose input the trail does not keep.
	req.Input = nil
	if d := s.Decide(req); d.Allow || !d.Failed {
		t.Errorf("no input: %+v", d)
	}
	b := Broken(7, errTest)
	if d := b.Decide(req); d.Allow || !d.Failed || d.Version != 7 || !strings.Contains(d.Reason, "v7") {
		t.Errorf("a broken version: %+v", d)
	}
}

var errTest = jsonError("the text does not parse")

type jsonError string

func (e jsonError) Error() string { return string(e) }

// A set that does not parse, names two policies alike, or does not
// validate against the catalog's schemas is refused, every problem named.
func TestCompileAndValidate_RefuseWhatCannotBeHonoured(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		text, want string
	}{
		{`permit (principal, action, resource)`, "does not parse"},
		{`@id("a") permit (principal, action, resource); @id("a") forbid (principal, action, resource);`, "two policies are named"},
		{`// nothing`, "holds no policy"},
		{`permit (principal, action == Action::"email.sned", resource);`, "email.sned"},
		{`forbid (principal, action == Action::"email.send", resource) when { context.input.bcc == "x" };`, "bcc"},
		{`forbid (principal, action == Action::"orders.refund", resource) when { context.input.amount > 100 };`, "policy0"},
		{`forbid (principal is Robot, action, resource);`, "Robot"},
		{`forbid (principal, action, resource) when { resource.owner == "x" };`, "owner"},
	} {
		s, err := Compile("test.cedar", []byte(tt.text))
		if err == nil {
			err = s.Validate(catalog)
		}
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want an error naming %q", tt.text, err, tt.want)
		}
	}
}

// The schema types each input field as the input schema does, and leaves
// out what Cedar cannot type (a map).
func TestSchema_TypesTheInput(t *testing.T) {
	t.Parallel()
	sch := Schema(catalog)
	for _, want := range []string{
		`action "email.send" in ["call"]`,
		`"cc"?: Set<String>`, `"holdMs"?: Long`, `"sendAt"?: datetime`, `"subject": String`, `"to": String`,
		`"amount": decimal`, `"orderId": String`,
		`entity Agent in [Principal] tags String;`,
	} {
		if !strings.Contains(sch, want) {
			t.Errorf("schema lacks %s:\n%s", want, sch)
		}
	}
	if strings.Contains(sch, `"extra"`) {
		t.Errorf("a map's field is typed:\n%s", sch)
	}
}

// What policy test compares: a decision the trail lets both sets make
// changes or not; one that needs the input a recorded execution lacks is
// said to, not counted as a change; a case is held to what it expects.
func TestCompare_ChangesNeedsInputAndExpectations(t *testing.T) {
	t.Parallel()
	now := compile(t, `permit (principal, action, resource);`)
	with := compile(t, tenRules)
	cases := []Case{
		{ExecutionID: "e1", Principal: "beta", Actor: "user:alice", Capability: "email.send"},    // beta-no-mail: definite
		{ExecutionID: "e2", Principal: "acme", Actor: "user:alice", Capability: "email.send"},    // reads the input
		{ExecutionID: "e3", Principal: "acme", Actor: "user:alice", Capability: "orders.refund"}, // no rule of the input
		{Name: "c1", Principal: "acme", Actor: "agent:bot", Capability: "orders.refund", Expect: "deny", // as expected
			Input: json.RawMessage(`{"orderId":"o","amount":500}`)},
		{Name: "c2", Principal: "acme", Actor: "user:alice", Capability: "email.send", Expect: "deny", // not as expected
			Input: json.RawMessage(`{"to":"a@example.com","subject":"s"}`)},
	}
	out := Compare(now, with, cases, catalog)
	want := []struct{ changed, needsInput, unexpected bool }{
		{true, false, false}, {false, true, false}, {false, false, false}, {true, false, false}, {false, false, true},
	}
	for i, o := range out {
		if o.Changed != want[i].changed || o.NeedsInput != want[i].needsInput || o.Unexpected != want[i].unexpected {
			t.Errorf("case %d: changed=%v needsInput=%v unexpected=%v, want %+v (%+v)", i, o.Changed, o.NeedsInput, o.Unexpected, want[i], o)
		}
	}
	// With no set in force, every call is allowed, as today.
	if o := Compare(nil, with, cases[:1], catalog)[0]; o.Now.Word() != "allow" || !o.Changed {
		t.Errorf("against no set: %+v", o)
	}
}
