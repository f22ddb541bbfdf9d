package inputcheck

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/envelope"
)

type schemaTree struct {
	Name     string        `json:"name"`
	Children []*schemaTree `json:"children,omitempty"`
}

type schemaInput struct {
	OrderID string            `json:"orderId"`
	Amount  int64             `json:"amount"`
	Small   int8              `json:"small"`
	Count   uint16            `json:"count,omitempty"`
	Ratio   float64           `json:"ratio,omitempty"`
	Ok      bool              `json:"ok,omitempty"`
	Lines   []checkLine       `json:"lines"`
	Labels  map[string]int    `json:"labels,omitempty"`
	Ship    *checkAddress     `json:"ship"`
	Blob    []byte            `json:"blob,omitempty"`
	Any     any               `json:"any,omitempty"`
	Tree    schemaTree        `json:"tree,omitzero"`
	Pair    [2]string         `json:"pair,omitzero"`
	Raw     envelope.Raw      `json:"raw,omitempty"`
	Skipped string            `json:"-"`
	Named   map[string]string `json:"named,omitempty"`
	checkEmbedded
}

func schemaJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestInputSchema_DerivedFromTheGoType(t *testing.T) {
	s := jsonSchema(shapeOf(reflect.TypeFor[schemaInput]()))
	if s["$schema"] != schemaDialect || s["type"] != "object" || s["additionalProperties"] != false {
		t.Fatalf("root: %s", schemaJSON(t, s))
	}
	if got := schemaJSON(t, s["required"]); got != `["orderId","amount","small","lines"]` {
		t.Errorf("required %s: fields without omitempty that are not pointers", got)
	}
	props := s["properties"].(map[string]any)
	want := map[string]string{
		"orderId": `{"type":"string"}`,
		"amount":  `{"format":"int64","type":"integer"}`,
		"small":   `{"maximum":127,"minimum":-128,"type":"integer"}`,
		"count":   `{"maximum":65535,"minimum":0,"type":"integer"}`,
		"ratio":   `{"type":"number"}`,
		"ok":      `{"type":"boolean"}`,
		"lines": `{"items":{"additionalProperties":false,"properties":{"qty":{"maximum":2147483647,"minimum":-2147483648,"type":"integer"},` +
			`"sku":{"type":"string"}},"required":["sku","qty"],"type":"object"},"type":"array"}`,
		"labels": `{"additionalProperties":{"format":"int64","type":"integer"},"type":"object"}`,
		"ship":   `{"additionalProperties":false,"properties":{"city":{"type":"string"}},"required":["city"],"type":["object","null"]}`,
		"blob":   `{"contentEncoding":"base64","type":"string"}`,
		"any":    `{}`,
		"tree": `{"additionalProperties":false,"properties":{"children":{"items":{"$ref":"#/$defs/schemaTree"},"type":"array"},` +
			`"name":{"type":"string"}},"required":["name"],"type":"object"}`,
		"pair":  `{"items":{"type":"string"},"maxItems":2,"type":"array"}`,
		"raw":   `{}`,
		"named": `{"additionalProperties":{"type":"string"},"type":"object"}`,
		"note":  `{"type":"string"}`, // inlined from the embedded struct
	}
	for name, w := range want {
		if got := schemaJSON(t, props[name]); got != w {
			t.Errorf("%s: %s\n want %s", name, got, w)
		}
	}
	if len(props) != len(want) {
		t.Errorf("%d properties, want %d: %s", len(props), len(want), schemaJSON(t, props))
	}
	if d := s["$defs"].(map[string]any)["schemaTree"]; schemaJSON(t, d) != want["tree"] {
		t.Errorf("$defs.schemaTree: %s", schemaJSON(t, d))
	}
}

// An input generated from the schema passes the input check; the same input
// with a field the schema does not declare is refused. The schema shown to a
// model and the check an input meets agree.
func TestInputSchema_AgreesWithTheInputCheck(t *testing.T) {
	typ := reflect.TypeFor[schemaInput]()
	s := jsonSchema(shapeOf(typ))
	defs, _ := s["$defs"].(map[string]any)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 200 {
		v := generate(t, r, s, defs, 0).(map[string]any)
		raw := envelope.MustRaw(v)
		if issues := checkInput(raw, shapeOf(typ)); len(issues) > 0 {
			t.Fatalf("#%d: %s refused: %+v", i, schemaJSON(t, v), issues)
		}
		if err := decodeChecked(raw, shapeOf(typ), new(schemaInput)); err != nil {
			t.Fatalf("#%d: %s does not decode: %v", i, schemaJSON(t, v), err)
		}
		v["undeclared"] = 1
		if issues := checkInput(envelope.MustRaw(v), shapeOf(typ)); len(issues) != 1 || issues[0].Path != "undeclared" {
			t.Fatalf("#%d: an undeclared field gave %+v", i, issues)
		}
	}
}

// generate makes a value the schema allows (the subset the derivation emits).
func generate(t *testing.T, r *rand.Rand, s map[string]any, defs map[string]any, depth int) any {
	if ref, ok := s["$ref"].(string); ok {
		if depth > 3 {
			return nil
		}
		return generate(t, r, defs[strings.TrimPrefix(ref, "#/$defs/")].(map[string]any), defs, depth+1)
	}
	typ := s["type"]
	if types, ok := typ.([]any); ok { // a pointer: its type, or null
		if r.IntN(4) == 0 {
			return nil
		}
		typ = types[0]
	}
	switch typ {
	case "object":
		out := map[string]any{}
		if props, ok := s["properties"].(map[string]any); ok {
			for name, p := range props {
				if r.IntN(3) > 0 {
					out[name] = generate(t, r, p.(map[string]any), defs, depth+1)
				}
			}
			for _, name := range s["required"].([]string) {
				if _, ok := out[name]; !ok {
					out[name] = generate(t, r, props[name].(map[string]any), defs, depth+1)
				}
			}
		}
		if ap, ok := s["additionalProperties"].(map[string]any); ok {
			for i := range r.IntN(3) {
				out["k"+string(rune('a'+i))] = generate(t, r, ap, defs, depth+1)
			}
		}
		return out
	case "array":
		n := r.IntN(3)
		if m, ok := s["maxItems"].(int); ok && n > m {
			n = m
		}
		items := make([]any, n)
		for i := range items {
			items[i] = generate(t, r, s["items"].(map[string]any), defs, depth+1)
		}
		return items
	case "integer":
		lo, hi := int64(-1<<40), int64(1<<40)
		if m, ok := s["minimum"]; ok {
			lo = reflect.ValueOf(m).Convert(reflect.TypeFor[int64]()).Int()
		}
		if m, ok := s["maximum"]; ok {
			hi = int64(reflect.ValueOf(m).Convert(reflect.TypeFor[float64]()).Float())
		}
		switch r.IntN(3) {
		case 0:
			return lo
		case 1:
			return hi
		}
		return lo + r.Int64N(hi-lo+1)
	case "number":
		return r.Float64()
	case "string":
		if s["contentEncoding"] == "base64" {
			return "czE="
		}
		return "s"
	case "boolean":
		return r.IntN(2) == 0
	}
	return map[string]any{"anything": []any{1, "x"}}
}

type everyNumber struct {
	I   int           `json:"i"`
	I8  int8          `json:"i8"`
	I16 int16         `json:"i16"`
	I32 int32         `json:"i32"`
	I64 int64         `json:"i64"`
	U   uint          `json:"u"`
	U8  uint8         `json:"u8"`
	U32 uint32        `json:"u32"`
	U64 uint64        `json:"u64"`
	UP  uintptr       `json:"up"`
	F32 float32       `json:"f32"`
	D   time.Duration `json:"d"`
	Q   int64         `json:"q,string"`
	P   *uint64       `json:"p"`
	M   map[int64]int `json:"m"`
}

// A schema goes to model providers through JavaScript's JSON.stringify, which
// has no integer beyond 2^53 (and throws on the BigInt a msgpack reader makes
// of one): every integer a schema holds is one a float64 holds exactly, and
// 64-bit integers say their range with a format instead of bounds.
func TestInputSchema_NumbersAreExactInJSON(t *testing.T) {
	s := jsonSchema(shapeOf(reflect.TypeFor[everyNumber]()))
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				walk(path+"/"+k, e)
			}
		case []any:
			for i, e := range x {
				walk(fmt.Sprintf("%s/%d", path, i), e)
			}
		case string, bool, nil, []string:
		case float64, float32:
		default:
			rv := reflect.ValueOf(v)
			var big bool
			switch rv.Kind() {
			case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
				big = rv.Int() > 1<<53 || rv.Int() < -(1<<53)
			case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
				big = rv.Uint() > 1<<53
			default:
				t.Errorf("%s: a %T in a schema", path, v)
			}
			if big {
				t.Errorf("%s: %v is beyond 2^53: no JSON reader in JavaScript holds it", path, v)
			}
		}
	}
	walk("", s)
	props := s["properties"].(map[string]any)
	for name, want := range map[string]string{
		"i64": `{"format":"int64","type":"integer"}`,
		"u64": `{"format":"uint64","minimum":0,"type":"integer"}`,
		"i32": `{"maximum":2147483647,"minimum":-2147483648,"type":"integer"}`,
		"u32": `{"maximum":4294967295,"minimum":0,"type":"integer"}`,
	} {
		if got := schemaJSON(t, props[name]); got != want {
			t.Errorf("%s: %s, want %s", name, got, want)
		}
	}
}
