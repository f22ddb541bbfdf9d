package inputcheck

import (
	"net/netip"
	"reflect"

	"github.com/google/uuid"
)

// Schemas of the types an input reads with encoding/json's meaning (see
// inputjson.go): what is written here is what the input check accepts.

// durationPattern matches what time.ParseDuration reads.
const durationPattern = `^[-+]?(0|(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+)$`

func durationSchema() map[string]any {
	return map[string]any{
		"description": `A duration: a string like "1h30m", "90s" or "250ms" (units ns, us, ms, s, m, h), or an integer of nanoseconds.`,
		"anyOf": []any{
			map[string]any{"type": "string", "pattern": durationPattern},
			map[string]any{"type": "integer", "format": "int64"},
		},
	}
}

// textFormats describe well-known types that decode themselves from text.
var textFormats = map[reflect.Type]map[string]any{
	reflect.TypeFor[uuid.UUID]():      {"type": "string", "format": "uuid"},
	reflect.TypeFor[netip.Addr]():     {"type": "string", "anyOf": []any{map[string]any{"format": "ipv4"}, map[string]any{"format": "ipv6"}}},
	reflect.TypeFor[netip.Prefix]():   {"type": "string", "description": "An IP network in CIDR notation, like 10.0.0.0/8."},
	reflect.TypeFor[netip.AddrPort](): {"type": "string", "description": "An IP address and port, like 10.0.0.1:80 or [::1]:80."},
}

func textSchema(s *shape) map[string]any {
	if m, ok := textFormats[s.typ]; ok {
		return m
	}
	return map[string]any{"type": "string"}
}

// keySchema constrains the keys of a map whose keys are not plain strings.
func keySchema(k *shape) map[string]any {
	switch k.kind {
	case shapeInt:
		return map[string]any{"pattern": `^[-+]?[0-9]+$`}
	case shapeUint:
		return map[string]any{"pattern": `^[0-9]+$`} // strconv.ParseUint takes no sign
	case shapeText:
		if m, ok := textFormats[k.typ]; ok {
			return m
		}
	}
	return nil
}

// Patterns of JSON numbers, for fields with the json "string" option.
const (
	jsonIntegerPattern  = `^-?(0|[1-9][0-9]*)$`
	jsonUnsignedPattern = `^(0|[1-9][0-9]*)$`
	jsonNumberPattern   = `^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?$`
)

// quotedSchema is a field with the "string" option: its value, or the value's
// JSON text in a string.
func quotedSchema(s *shape, plain map[string]any) map[string]any {
	var str map[string]any
	switch s.kind {
	case shapeBool:
		str = map[string]any{"type": "string", "enum": []any{"true", "false"}}
	case shapeInt:
		str = map[string]any{"type": "string", "pattern": jsonIntegerPattern}
	case shapeUint:
		str = map[string]any{"type": "string", "pattern": jsonUnsignedPattern}
	case shapeFloat:
		str = map[string]any{"type": "string", "pattern": jsonNumberPattern}
	default:
		return plain
	}
	return map[string]any{"anyOf": []any{plain, str}}
}

// nullable lets a pointer field be null, which leaves it nil.
func nullable(m map[string]any) map[string]any {
	if t, ok := m["type"].(string); ok && m["enum"] == nil {
		return withKey(m, "type", []any{t, "null"}) // format and bounds apply to their own type only
	}
	return map[string]any{"anyOf": []any{m, map[string]any{"type": "null"}}}
}
