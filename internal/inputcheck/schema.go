package inputcheck

import (
	"math"
	"strconv"
)

// JSON Schema of a capability's input, derived from its Go input type through
// the same compiled shape that stage 5 checks inputs against, so the schema a
// model is shown and the check an input meets do not drift apart:
//
//   - a struct is an object of its json-named fields, additionalProperties
//     false (unknown fields are refused); embedded structs are inlined;
//   - required lists the fields without omitempty (or omitzero) that are not
//     pointers. The check itself lets a field be absent (it decodes as the
//     zero value): a Validate method is where presence is enforced;
//   - integers are integers, bounded when narrower than 64 bits or unsigned;
//   - slices and arrays are arrays of their items, maps objects of their
//     values, []byte and types that decode themselves from text are strings;
//   - interfaces and types with their own msgpack decoder are unconstrained;
//   - a recursive type refers to its definition in $defs.

// schemaDialect is the JSON Schema version the derived schemas follow.
const schemaDialect = "https://json-schema.org/draft/2020-12/schema"

func jsonSchema(s *shape) map[string]any {
	if s == nil {
		return nil
	}
	g := schemaGen{onStack: map[*shape]bool{}, defs: map[*shape]string{}, names: map[string]bool{}}
	root := g.schema(s)
	if len(g.defs) > 0 {
		defs := map[string]any{}
		for sh, name := range g.defs {
			defs[name] = g.bodies[sh]
		}
		root = withKey(root, "$defs", defs)
	}
	return withKey(root, "$schema", schemaDialect)
}

func withKey(m map[string]any, k string, v any) map[string]any {
	out := make(map[string]any, len(m)+1)
	for a, b := range m {
		out[a] = b
	}
	out[k] = v
	return out
}

type schemaGen struct {
	onStack map[*shape]bool
	defs    map[*shape]string
	names   map[string]bool
	bodies  map[*shape]map[string]any
}

func (g *schemaGen) schema(s *shape) map[string]any {
	switch s.kind {
	case shapeBool:
		return map[string]any{"type": "boolean"}
	case shapeInt:
		m := map[string]any{"type": "integer"}
		if s.bits < 64 {
			m["minimum"] = -int64(1) << (s.bits - 1)
			m["maximum"] = int64(1)<<(s.bits-1) - 1
		}
		return m
	case shapeUint:
		m := map[string]any{"type": "integer", "minimum": 0}
		if s.bits < 64 {
			m["maximum"] = uint64(math.MaxUint64) >> (64 - s.bits)
		}
		return m
	case shapeFloat:
		return map[string]any{"type": "number"}
	case shapeString, shapeBytes:
		return map[string]any{"type": "string"}
	case shapeTime:
		return map[string]any{"description": "a msgpack timestamp (extension type -1)"}
	case shapeSlice:
		return map[string]any{"type": "array", "items": g.schema(s.elem)}
	case shapeArray:
		return map[string]any{"type": "array", "items": g.schema(s.elem), "maxItems": s.n}
	case shapeMap:
		return map[string]any{"type": "object", "additionalProperties": g.schema(s.elem)}
	case shapeStruct:
		return g.object(s)
	}
	return map[string]any{}
}

func (g *schemaGen) object(s *shape) map[string]any {
	if g.onStack[s] {
		return map[string]any{"$ref": "#/$defs/" + g.defName(s)}
	}
	g.onStack[s] = true
	defer delete(g.onStack, s)
	props := make(map[string]any, len(s.order))
	var required []string
	for _, f := range s.order {
		props[f.name] = g.schema(f.shape)
		if !f.omitEmpty && !f.pointer {
			required = append(required, f.name)
		}
	}
	m := map[string]any{"type": "object", "properties": props, "additionalProperties": false}
	if len(required) > 0 {
		m["required"] = required
	}
	if _, recursive := g.defs[s]; recursive {
		if g.bodies == nil {
			g.bodies = map[*shape]map[string]any{}
		}
		g.bodies[s] = m
	}
	return m
}

// defName names a recursive type's definition, once.
func (g *schemaGen) defName(s *shape) string {
	if n, ok := g.defs[s]; ok {
		return n
	}
	base := s.name
	if base == "" {
		base = "T"
	}
	n := base
	for i := 2; g.names[n]; i++ {
		n = base + strconv.Itoa(i)
	}
	g.names[n] = true
	g.defs[s] = n
	return n
}
