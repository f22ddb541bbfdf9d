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
//     pointers, and the check refuses an object without one of them
//     ("missing required field" at its path);
//   - integers are integers, bounded by their width where the bounds are
//     exact as JSON numbers everywhere (up to 32 bits); a 64-bit integer
//     says its range with format int64 or uint64 instead, as OpenAPI does,
//     since ±2^63 is no number a JavaScript program (a model provider's SDK
//     serializing the schema) holds or writes exactly;
//   - a pointer field may be null;
//   - slices and arrays are arrays of their items, maps objects of their
//     values (keys of integer maps are integers in strings);
//   - []byte is a string with contentEncoding base64, time.Time a string of
//     format date-time, time.Duration a duration string or integer
//     nanoseconds, types that decode themselves from text strings (with a
//     format for well-known ones: uuid, IP addresses);
//   - a field with the json "string" option takes its value or the value in
//     a string;
//   - interfaces and types with their own JSON or msgpack decoder are
//     unconstrained;
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
	case shapeInt, shapeUint:
		return integerSchema(s)
	case shapeFloat:
		if s.bits == 32 {
			return map[string]any{"type": "number", "minimum": -math.MaxFloat32, "maximum": math.MaxFloat32}
		}
		return map[string]any{"type": "number"}
	case shapeString:
		return map[string]any{"type": "string"}
	case shapeBytes:
		return map[string]any{"type": "string", "contentEncoding": "base64"}
	case shapeTime:
		return map[string]any{"type": "string", "format": "date-time"}
	case shapeDuration:
		return durationSchema()
	case shapeText:
		return textSchema(s)
	case shapeSlice:
		return map[string]any{"type": "array", "items": g.schema(s.elem)}
	case shapeArray:
		return map[string]any{"type": "array", "items": g.schema(s.elem), "maxItems": s.n}
	case shapeMap:
		m := map[string]any{"type": "object", "additionalProperties": g.schema(s.elem)}
		if k := keySchema(s.key); k != nil {
			m["propertyNames"] = k
		}
		return m
	case shapeStruct:
		return g.object(s)
	}
	return map[string]any{}
}

// maxExactBits is the widest integer whose bounds every JSON reader holds
// exactly: a float64 holds every integer up to 2^53.
const maxExactBits = 53

// integerSchema is an integer shape's schema: bounded by its width, or, for
// 64 bits, named by its format (the input check refuses what the format
// does not hold, as it refuses what is beyond a narrower type's bounds).
func integerSchema(s *shape) map[string]any {
	if s.kind == shapeUint {
		if s.bits > maxExactBits {
			return map[string]any{"type": "integer", "minimum": 0, "format": "uint64"}
		}
		return map[string]any{"type": "integer", "minimum": 0, "maximum": uint64(math.MaxUint64) >> (64 - s.bits)}
	}
	if s.bits > maxExactBits {
		return map[string]any{"type": "integer", "format": "int64"}
	}
	return map[string]any{"type": "integer", "minimum": -int64(1) << (s.bits - 1), "maximum": int64(uint64(1)<<(s.bits-1) - 1)}
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
		if f.quoted {
			props[f.name] = quotedSchema(f.shape, props[f.name].(map[string]any))
		}
		if f.pointer {
			props[f.name] = nullable(props[f.name].(map[string]any))
		}
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
