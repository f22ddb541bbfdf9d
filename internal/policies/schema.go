package policies

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	cedar "github.com/cedar-policy/cedar-go"
	"github.com/cedar-policy/cedar-go/types"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/envelope"
)

// Capability is what a policy sees of a capability: its id, what its
// metadata says of it, and the JSON Schema of its input (from the catalog's
// descriptor, or the worker's registry).
type Capability struct {
	ID          string
	SideEffect  string
	Risk        string
	Idempotent  bool
	Tags        []string
	InputSchema map[string]any
}

// The entity types and the action group of capstan's Cedar schema.
const (
	principalType  = "Principal"
	capabilityType = "Capability"
	actionType     = "Action"
	callAction     = "call"
)

// actorTypes are the entity types of the actor kinds.
var actorTypes = map[string]cedar.EntityType{"user": "User", "agent": "Agent", "service": "Service", "anonymous": "Anonymous"}

// actorType is the entity type of an actor kind ("" for an unknown kind).
func actorType(kind string) cedar.EntityType { return actorTypes[kind] }

// Schema is the Cedar schema of the capabilities: the entity types of
// principals, actors and capabilities, and one action per capability, in the
// action "call", whose context types the capability's input.
func Schema(caps []Capability) string {
	var b strings.Builder
	b.WriteString("// capstan's Cedar schema, made from the catalog (DESIGN §18).\n")
	fmt.Fprintf(&b, "entity %s;\n", principalType)
	for _, t := range []string{"User", "Agent", "Service", "Anonymous"} {
		fmt.Fprintf(&b, "entity %s in [%s] tags String;\n", t, principalType)
	}
	fmt.Fprintf(&b, "entity %s = { sideEffect: String, risk: String, idempotent: Bool, tags: Set<String> };\n", capabilityType)
	fmt.Fprintf(&b, "action %q;\n", callAction)
	caps = slices.Clone(caps)
	slices.SortFunc(caps, func(a, b Capability) int { return strings.Compare(a.ID, b.ID) })
	for _, c := range caps {
		fmt.Fprintf(&b, "action %q in [%q] appliesTo {\n  principal: [User, Agent, Service, Anonymous],\n  resource: [%s],\n  context: { surface: String",
			c.ID, callAction, capabilityType)
		if t := cedarType(c.InputSchema); t != "" {
			b.WriteString(", input: " + t)
		}
		b.WriteString(" }\n};\n")
	}
	return b.String()
}

// cedarType is the Cedar type of a JSON Schema, "" for one Cedar cannot
// type (a map, a value of several types): a policy cannot read such a field.
func cedarType(s map[string]any) string {
	typ, _ := schemaType(s)
	switch typ {
	case "boolean":
		return "Bool"
	case "integer":
		return "Long"
	case "number":
		return "decimal"
	case "string":
		if s["format"] == "date-time" {
			return "datetime"
		}
		return "String"
	case "array":
		items, _ := s["items"].(map[string]any)
		if t := cedarType(items); t != "" {
			return "Set<" + t + ">"
		}
		return ""
	case "object":
		props, _ := s["properties"].(map[string]any)
		if len(props) == 0 {
			if s["additionalProperties"] == nil || s["additionalProperties"] == false {
				return "{}"
			}
			return "" // a map: keys no schema can name
		}
		required := map[string]bool{}
		for _, r := range asList(s["required"]) {
			if name, ok := r.(string); ok {
				required[name] = true
			}
		}
		names := make([]string, 0, len(props))
		for name := range props {
			names = append(names, name)
		}
		slices.Sort(names)
		var fields []string
		for _, name := range names {
			ps, _ := props[name].(map[string]any)
			t := cedarType(ps)
			if t == "" {
				continue
			}
			_, nullable := schemaType(ps)
			opt := ""
			if !required[name] || nullable {
				opt = "?"
			}
			fields = append(fields, strconv.Quote(name)+opt+": "+t)
		}
		return "{ " + strings.Join(fields, ", ") + " }"
	}
	return ""
}

// schemaType is a schema's one type and whether null is allowed too; ""
// when it has none or several.
func schemaType(s map[string]any) (string, bool) {
	if s == nil {
		return "", false
	}
	switch t := s["type"].(type) {
	case string:
		return t, false
	case []any:
		var one string
		null := false
		for _, x := range t {
			switch x {
			case "null":
				null = true
			default:
				if one != "" {
					return "", false
				}
				one, _ = x.(string)
			}
		}
		return one, null
	}
	if alts, ok := s["anyOf"].([]any); ok && len(alts) == 2 {
		// What inputcheck makes of a nullable type with an enum or bounds.
		for i, x := range alts {
			if m, ok := x.(map[string]any); ok && m["type"] == "null" {
				other, _ := alts[1-i].(map[string]any)
				t, _ := schemaType(other)
				return t, true
			}
		}
	}
	if s["properties"] != nil {
		return "object", false
	}
	return "", false
}

func asList(v any) []any {
	switch l := v.(type) {
	case []any:
		return l
	case []string:
		out := make([]any, len(l))
		for i, s := range l {
			out[i] = s
		}
		return out
	}
	return nil
}

// value is the Cedar value of v, a JSON value (numbers as json.Number), as
// the schema s types it; ok is false for a value Cedar cannot hold as that
// type (then it is left out, and a policy that reads it fails closed).
func value(v any, s map[string]any) (cedar.Value, bool) {
	typ, _ := schemaType(s)
	switch typ {
	case "boolean":
		b, ok := v.(bool)
		return cedar.Boolean(b), ok
	case "integer":
		n, ok := v.(json.Number)
		if !ok {
			return nil, false
		}
		i, err := strconv.ParseInt(string(n), 10, 64)
		return cedar.Long(i), err == nil
	case "number":
		n, ok := v.(json.Number)
		if !ok {
			return nil, false
		}
		d, err := decimal(string(n))
		return d, err == nil
	case "string":
		str, ok := v.(string)
		if !ok {
			return nil, false
		}
		if s["format"] == "date-time" {
			t, err := time.Parse(time.RFC3339Nano, str)
			if err != nil {
				return nil, false
			}
			return cedar.NewDatetime(t), true
		}
		return cedar.String(str), true
	case "array":
		list, ok := v.([]any)
		items, _ := s["items"].(map[string]any)
		if !ok || cedarType(items) == "" {
			return nil, false
		}
		vals := make([]cedar.Value, 0, len(list))
		for _, x := range list {
			cv, ok := value(x, items)
			if !ok {
				return nil, false
			}
			vals = append(vals, cv)
		}
		return cedar.NewSet(vals...), true
	case "object":
		obj, ok := v.(map[string]any)
		if !ok || cedarType(s) == "" {
			return nil, false
		}
		props, _ := s["properties"].(map[string]any)
		rec := make(cedar.RecordMap, len(props))
		for name, ps := range props {
			x, present := obj[name]
			if !present || x == nil {
				continue
			}
			if cv, ok := value(x, asMap(ps)); ok {
				rec[cedar.String(name)] = cv
			}
		}
		return cedar.NewRecord(rec), true
	}
	return nil, false
}

func asMap(v any) map[string]any {
	m, _ := v.(map[string]any)
	return m
}

// decimal is a JSON number as a Cedar decimal: four digits after the point
// at most, exactly, else an error.
func decimal(n string) (cedar.Decimal, error) {
	if strings.ContainsAny(n, "eE") {
		f, err := strconv.ParseFloat(n, 64)
		if err != nil || math.IsInf(f, 0) {
			return cedar.Decimal{}, fmt.Errorf("number %s", n)
		}
		n = strconv.FormatFloat(f, 'f', -1, 64)
	}
	if !strings.Contains(n, ".") {
		n += ".0"
	}
	return types.ParseDecimal(n)
}

// catalogEntry is what the catalog's descriptors (executor.Descriptor)
// hold that a policy sees.
type catalogEntry struct {
	ID          string         `json:"id"`
	SideEffect  string         `json:"sideEffect"`
	Risk        string         `json:"risk,omitempty"`
	Idempotent  bool           `json:"idempotent,omitempty"`
	Tags        []string       `json:"tags,omitempty"`
	InputSchema map[string]any `json:"inputSchema,omitempty"`
}

// Catalog reads every capability of the catalog bucket, sorted by id.
func Catalog(ctx context.Context, kv jetstream.KeyValue) ([]Capability, error) {
	keys, err := kv.ListKeys(ctx)
	if err != nil {
		return nil, err
	}
	var out []Capability
	for k := range keys.Keys() {
		if strings.HasPrefix(k, "_") {
			continue // a pool's liveness, the resources: no capability
		}
		e, err := kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		var d catalogEntry
		if err := envelope.Unmarshal(e.Value(), &d); err != nil || d.ID != k {
			continue // a descriptor that does not decode describes nothing a policy could name
		}
		out = append(out, Capability(d))
	}
	slices.SortFunc(out, func(a, b Capability) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}
