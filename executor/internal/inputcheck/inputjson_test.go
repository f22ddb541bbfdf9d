package inputcheck

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/google/uuid"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/vmihailenco/msgpack/v5"
)

// The types a handler declares, each under "v" of its input.
type jsonIn[T any] struct {
	V T `json:"v"`
}

// celsius decodes itself from JSON: a number, or a string like "21.5C".
type celsius float64

func (c *celsius) UnmarshalJSON(b []byte) error {
	var f float64
	if s, ok := bytes.CutSuffix(bytes.Trim(b, `"`), []byte("C")); ok && b[0] == '"' {
		b = s
	}
	if err := json.Unmarshal(b, &f); err != nil {
		return errors.New("expected degrees Celsius")
	}
	if f < -273.15 {
		return errors.New("below absolute zero")
	}
	*c = celsius(f)
	return nil
}

type jsonNested struct {
	Inner struct {
		N int `json:"n"`
	} `json:"inner"`
}

type jsonEmbeddedPart struct {
	Note string `json:"note"`
}

type jsonEmbedding struct {
	jsonEmbeddedPart
	Own string `json:"own"`
}

type jsonOptional struct {
	Name  string `json:"name,omitempty"`
	Count int    `json:"count"`
}

type jsonQuoted struct {
	N  int64   `json:"n,string"`
	U  uint8   `json:"u,string,omitempty"`
	F  float32 `json:"f,string,omitempty"`
	OK bool    `json:"ok,string,omitempty"`
}

// typeCase is one Go input type with JSON an agent sends for it.
type typeCase struct {
	name   string
	typ    reflect.Type
	decode func(envelope.Raw) (any, error) // stage 5 for the type
	good   []goodJSON
	bad    []badJSON
}

type goodJSON struct {
	json string
	want any // the decoded input
}

type badJSON struct {
	json string
	path string // the path of the issue
	// schemaBlind marks a value the schema cannot tell from a valid one (a
	// type that decodes itself): only the check refuses it.
	schemaBlind bool
}

func ok(j string, want any) goodJSON { return goodJSON{j, want} }
func bad(j, path string) badJSON     { return badJSON{json: j, path: path} }

func caseOf[T any](name string, good []goodJSON, bads ...badJSON) typeCase {
	s := shapeOf(reflect.TypeFor[T]())
	return typeCase{name: name, typ: reflect.TypeFor[T](), good: good, bad: bads,
		decode: func(raw envelope.Raw) (any, error) {
			in, err := decodeInput[T](raw, s)
			if err != nil {
				return nil, err
			}
			return *in, nil
		}}
}

// v is a value of T under "v", in the good cases' terms.
func v[T any](x T) jsonIn[T] { return jsonIn[T]{V: x} }

func ptr[T any](x T) *T { return &x }

var (
	at       = time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	addr4    = netip.MustParseAddr("10.0.0.1")
	addr6    = netip.MustParseAddr("2001:db8::1")
	anID     = uuid.MustParse("0190d6c8-8b7e-7c3a-9f4e-2b1d3c4e5f60")
	tenBytes = []byte{0, 1, 2, 250, 251, 252, 253, 254, 255, 0}
)

func typeCases() []typeCase {
	nested := jsonNested{}
	nested.Inner.N = 3
	return []typeCase{
		caseOf[jsonIn[time.Time]]("time.Time", []goodJSON{
			ok(`{"v":"2026-11-30T10:00:00Z"}`, v(at)),
			ok(`{"v":"2026-11-30T11:30:00.5+01:30"}`, v(at.Add(500*time.Millisecond))),
		}, bad(`{"v":"2026-11-30"}`, "v"), bad(`{"v":"yesterday"}`, "v"), bad(`{"v":1764496800}`, "v")),
		caseOf[jsonIn[time.Duration]]("time.Duration", []goodJSON{
			ok(`{"v":1500000000}`, v(1500*time.Millisecond)),
			ok(`{"v":"1m30s"}`, v(90*time.Second)),
			ok(`{"v":"250ms"}`, v(250*time.Millisecond)),
			ok(`{"v":"-2h"}`, v(-2*time.Hour)),
		}, bad(`{"v":"soon"}`, "v"), bad(`{"v":"1d"}`, "v"), bad(`{"v":1.5}`, "v"), bad(`{"v":true}`, "v")),
		caseOf[jsonIn[int8]]("int8", []goodJSON{ok(`{"v":-128}`, v(int8(-128))), ok(`{"v":127}`, v(int8(127)))},
			bad(`{"v":128}`, "v"), bad(`{"v":-129}`, "v"), bad(`{"v":1.5}`, "v"), bad(`{"v":"1"}`, "v")),
		caseOf[jsonIn[int16]]("int16", []goodJSON{ok(`{"v":-32768}`, v(int16(-32768))), ok(`{"v":32767}`, v(int16(32767)))},
			bad(`{"v":32768}`, "v"), bad(`{"v":-32769}`, "v")),
		caseOf[jsonIn[int32]]("int32", []goodJSON{ok(`{"v":-2147483648}`, v(int32(math.MinInt32))), ok(`{"v":2147483647}`, v(int32(math.MaxInt32)))},
			bad(`{"v":2147483648}`, "v"), bad(`{"v":-2147483649}`, "v")),
		caseOf[jsonIn[int64]]("int64", []goodJSON{ok(`{"v":-9223372036854775808}`, v(int64(math.MinInt64))), ok(`{"v":9223372036854775807}`, v(int64(math.MaxInt64)))},
			bad(`{"v":9223372036854775808}`, "v"), bad(`{"v":-9223372036854775809}`, "v"), bad(`{"v":1e30}`, "v")),
		caseOf[jsonIn[int]]("int", []goodJSON{ok(`{"v":-1}`, v(-1)), ok(`{"v":9223372036854775807}`, v(math.MaxInt))},
			bad(`{"v":9223372036854775808}`, "v"), bad(`{"v":2.5}`, "v")),
		caseOf[jsonIn[uint8]]("uint8", []goodJSON{ok(`{"v":0}`, v(uint8(0))), ok(`{"v":255}`, v(uint8(255)))},
			bad(`{"v":256}`, "v"), bad(`{"v":-1}`, "v")),
		caseOf[jsonIn[uint16]]("uint16", []goodJSON{ok(`{"v":65535}`, v(uint16(65535)))}, bad(`{"v":65536}`, "v"), bad(`{"v":-1}`, "v")),
		caseOf[jsonIn[uint32]]("uint32", []goodJSON{ok(`{"v":4294967295}`, v(uint32(math.MaxUint32)))}, bad(`{"v":4294967296}`, "v")),
		caseOf[jsonIn[uint64]]("uint64", []goodJSON{ok(`{"v":18446744073709551615}`, v(uint64(math.MaxUint64)))},
			bad(`{"v":18446744073709551616}`, "v"), bad(`{"v":-1}`, "v")),
		caseOf[jsonIn[uint]]("uint", []goodJSON{ok(`{"v":7}`, v(uint(7)))}, bad(`{"v":-7}`, "v")),
		caseOf[jsonIn[float32]]("float32", []goodJSON{
			ok(`{"v":0.5}`, v(float32(0.5))), ok(`{"v":0.1}`, v(float32(0.1))), ok(`{"v":3}`, v(float32(3))),
			ok(`{"v":-3.4e38}`, v(float32(-3.4e38))),
		}, bad(`{"v":3.5e38}`, "v"), bad(`{"v":"0.5"}`, "v")),
		caseOf[jsonIn[float64]]("float64", []goodJSON{ok(`{"v":1e308}`, v(1e308)), ok(`{"v":-0.25}`, v(-0.25)), ok(`{"v":12}`, v(12.0))},
			bad(`{"v":"x"}`, "v"), bad(`{"v":true}`, "v")),
		caseOf[jsonIn[bool]]("bool", []goodJSON{ok(`{"v":true}`, v(true))}, bad(`{"v":"true"}`, "v"), bad(`{"v":1}`, "v")),
		caseOf[jsonIn[string]]("string", []goodJSON{ok(`{"v":"héllo\n"}`, v("héllo\n"))}, bad(`{"v":5}`, "v"), bad(`{"v":null,"w":1}`, "w")),
		caseOf[jsonIn[[]byte]]("[]byte", []goodJSON{ok(`{"v":"AAEC+vv8/f7/AA=="}`, v(tenBytes)), ok(`{"v":""}`, v([]byte{}))},
			bad(`{"v":"not base64!"}`, "v"), bad(`{"v":"AAE"}`, "v"), bad(`{"v":[1,2]}`, "v")),
		caseOf[jsonIn[*int32]]("pointer", []goodJSON{ok(`{"v":5}`, v(ptr(int32(5)))), ok(`{"v":null}`, v[*int32](nil)), ok(`{}`, v[*int32](nil))},
			bad(`{"v":"5"}`, "v"), bad(`{"v":2147483648}`, "v")),
		caseOf[jsonIn[jsonNested]]("nested struct", []goodJSON{ok(`{"v":{"inner":{"n":3}}}`, v(nested))},
			bad(`{"v":{"inner":{"n":3,"m":4}}}`, "v.inner.m"), bad(`{"v":{"inner":[3]}}`, "v.inner"), bad(`{"v":{"inner":{}}}`, "v.inner.n")),
		caseOf[jsonIn[map[string]int]]("map[string]int", []goodJSON{ok(`{"v":{"a":1,"b c":2}}`, v(map[string]int{"a": 1, "b c": 2}))},
			bad(`{"v":{"a":"1"}}`, "v.a"), bad(`{"v":[1]}`, "v")),
		caseOf[jsonIn[map[int16]string]]("map[int16]string", []goodJSON{ok(`{"v":{"1":"a","-2":"b"}}`, v(map[int16]string{1: "a", -2: "b"}))},
			bad(`{"v":{"x":"a"}}`, "v.x"), badJSON{json: `{"v":{"70000":"a"}}`, path: `v["70000"]`, schemaBlind: true}),
		caseOf[jsonIn[map[netip.Addr]bool]]("map[netip.Addr]bool", []goodJSON{ok(`{"v":{"10.0.0.1":true}}`, v(map[netip.Addr]bool{addr4: true}))},
			bad(`{"v":{"10.0.0.300":true}}`, `v["10.0.0.300"]`)),
		caseOf[jsonIn[[]string]]("[]string", []goodJSON{ok(`{"v":["a","b"]}`, v([]string{"a", "b"})), ok(`{"v":[]}`, v([]string{}))},
			bad(`{"v":["a",1]}`, "v[1]"), bad(`{"v":"a"}`, "v")),
		caseOf[jsonIn[[2]int]]("[2]int", []goodJSON{ok(`{"v":[1,2]}`, v([2]int{1, 2}))}, bad(`{"v":[1,2,3]}`, "v")),
		caseOf[jsonIn[json.RawMessage]]("json.RawMessage", []goodJSON{
			ok(`{"v":{"any":["json",1,2.5,null]}}`, v(json.RawMessage(`{"any":["json",1,2.5,null]}`))),
			ok(`{"v":"text"}`, v(json.RawMessage(`"text"`))),
		}),
		caseOf[jsonIn[celsius]]("json.Unmarshaler", []goodJSON{ok(`{"v":21.5}`, v(celsius(21.5))), ok(`{"v":"-40C"}`, v(celsius(-40)))},
			badJSON{json: `{"v":-300}`, path: "v", schemaBlind: true}, badJSON{json: `{"v":"warm"}`, path: "v", schemaBlind: true}),
		caseOf[jsonIn[netip.Addr]]("netip.Addr", []goodJSON{ok(`{"v":"10.0.0.1"}`, v(addr4)), ok(`{"v":"2001:db8::1"}`, v(addr6))},
			bad(`{"v":"10.0.0.256"}`, "v"), bad(`{"v":"localhost"}`, "v"), bad(`{"v":167772161}`, "v")),
		caseOf[jsonIn[uuid.UUID]]("uuid.UUID", []goodJSON{ok(`{"v":"0190d6c8-8b7e-7c3a-9f4e-2b1d3c4e5f60"}`, v(anID))},
			bad(`{"v":"0190d6c8"}`, "v"), bad(`{"v":"0190d6c8-8b7e-7c3a-9f4e-2b1d3c4e5fzz"}`, "v")),
		caseOf[jsonEmbedding]("embedded struct", []goodJSON{ok(`{"note":"n","own":"o"}`, jsonEmbedding{jsonEmbeddedPart{"n"}, "o"})},
			bad(`{"jsonEmbeddedPart":{},"note":"n","own":"o"}`, "jsonEmbeddedPart"), bad(`{"own":"o"}`, "note"), bad(`{"note":1,"own":"o"}`, "note")),
		caseOf[jsonOptional]("omitempty", []goodJSON{ok(`{"count":1}`, jsonOptional{Count: 1}), ok(`{"name":"x","count":0}`, jsonOptional{"x", 0})},
			bad(`{"name":7,"count":1}`, "name"), bad(`{"name":"x"}`, "count")),
		caseOf[jsonQuoted]("string option", []goodJSON{
			ok(`{"n":"-12","u":"255","f":"0.5","ok":"true"}`, jsonQuoted{-12, 255, 0.5, true}),
			ok(`{"n":7,"ok":false}`, jsonQuoted{N: 7}), // as the msgpack library writes it
		}, bad(`{"n":"x"}`, "n"), badJSON{json: `{"n":"12","u":"256"}`, path: "u", schemaBlind: true}, bad(`{"n":"+1"}`, "n"), bad(`{"n":"1","ok":"yes"}`, "ok")),
	}
}

// compileSchema compiles the schema describe publishes for t, asserting
// formats and content encodings (JSON Schema leaves both as annotations
// unless told otherwise).
func compileSchema(t *testing.T, typ reflect.Type) *jsonschema.Schema {
	t.Helper()
	b, err := json.Marshal(jsonSchema(shapeOf(typ)))
	if err != nil {
		t.Fatal(err)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	c.AssertContent()
	// The formats of 64-bit integers, as OpenAPI defines them.
	c.RegisterFormat(&jsonschema.Format{Name: "int64", Validate: integerFormat(func(s string) error { _, err := strconv.ParseInt(s, 10, 64); return err })})
	c.RegisterFormat(&jsonschema.Format{Name: "uint64", Validate: integerFormat(func(s string) error { _, err := strconv.ParseUint(s, 10, 64); return err })})
	if err := c.AddResource("input.json", doc); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile("input.json")
	if err != nil {
		t.Fatalf("schema %s: %v", b, err)
	}
	return s
}

// integerFormat checks a number's text with parse; other values are not of
// the format's type, which it leaves alone.
func integerFormat(parse func(string) error) func(any) error {
	return func(v any) error {
		if n, ok := v.(json.Number); ok {
			return parse(string(n))
		}
		return nil
	}
}

func validates(t *testing.T, s *jsonschema.Schema, j string) error {
	t.Helper()
	inst, err := jsonschema.UnmarshalJSON(strings.NewReader(j))
	if err != nil {
		t.Fatal(err)
	}
	return s.Validate(inst)
}

// sameInput compares a decoded input with the expected one: times as
// instants, JSON by meaning, everything else exactly.
func sameInput(got, want any) bool {
	g, w := reflect.ValueOf(got), reflect.ValueOf(want)
	if g.Type() != w.Type() {
		return false
	}
	if g.Kind() == reflect.Struct && g.NumField() == 1 && g.Type().Field(0).Name == "V" {
		g, w = g.Field(0), w.Field(0)
	}
	switch x := g.Interface().(type) {
	case time.Time:
		return x.Equal(w.Interface().(time.Time))
	case json.RawMessage:
		var a, b any
		return json.Unmarshal(x, &a) == nil && json.Unmarshal(w.Interface().(json.RawMessage), &b) == nil && reflect.DeepEqual(a, b)
	}
	return reflect.DeepEqual(g.Interface(), w.Interface())
}

// For every type in the list, JSON an agent sends is valid against the schema
// describe publishes and decodes to the value encoding/json gives; JSON that
// does not fit is refused by both, the check naming the path. Inputs travel as
// the CLI and clients send JSON: converted to msgpack by envelope.RawFromJSON.
func TestJSONInput_SchemaAndCheckAgreeForEveryType(t *testing.T) {
	for _, c := range typeCases() {
		t.Run(c.name, func(t *testing.T) {
			schema := compileSchema(t, c.typ)
			for _, g := range c.good {
				if err := validates(t, schema, g.json); err != nil {
					t.Errorf("%s: the schema refuses it: %v", g.json, err)
				}
				raw, err := envelope.RawFromJSON([]byte(g.json))
				if err != nil {
					t.Fatal(err)
				}
				got, err := c.decode(raw)
				if err != nil {
					t.Errorf("%s: refused: %v", g.json, err)
					continue
				}
				if !sameInput(got, g.want) {
					t.Errorf("%s: decoded %#v, want %#v", g.json, got, g.want)
				}
				// encoding/json gives the same value.
				std := reflect.New(c.typ)
				if err := json.Unmarshal([]byte(g.json), std.Interface()); err == nil && !sameInput(std.Elem().Interface(), got) {
					t.Errorf("%s: decoded %#v, encoding/json gives %#v", g.json, got, std.Elem().Interface())
				}
			}
			for _, b := range c.bad {
				if err := validates(t, schema, b.json); err == nil && !b.schemaBlind {
					t.Errorf("%s: the schema accepts it", b.json)
				}
				raw, err := envelope.RawFromJSON([]byte(b.json))
				if err != nil {
					t.Fatal(err)
				}
				_, err = c.decode(raw)
				var ie *InputError
				if !errors.As(err, &ie) {
					t.Errorf("%s: accepted (err %v)", b.json, err)
					continue
				}
				if len(ie.Issues) != 1 || ie.Issues[0].Path != b.path || ie.Issues[0].Message == "" {
					t.Errorf("%s: issues %+v, want one at %q", b.json, ie.Issues, b.path)
				}
			}
		})
	}
}

// Go clients send msgpack written from their own types: timestamps, binary
// data, 32-bit floats, binary forms of text types. Those read the same.
func TestJSONInput_GoClientsMsgpackReadsTheSame(t *testing.T) {
	type all struct {
		At    time.Time          `json:"at"`
		Wait  time.Duration      `json:"wait"`
		F32   float32            `json:"f32"`
		Blob  []byte             `json:"blob"`
		Addr  netip.Addr         `json:"addr"`
		ID    uuid.UUID          `json:"id"`
		Hosts map[netip.Addr]int `json:"hosts"`
		Arr   [3]byte            `json:"arr"`
		N     int64              `json:"n,string"`
		Temp  celsius            `json:"temp"`
		Raw   json.RawMessage    `json:"raw"`
		Keys  map[int]string     `json:"keys"`
		Any   any                `json:"any"`
	}
	in := all{At: at.Add(123456789), Wait: time.Minute, F32: 0.1, Blob: tenBytes, Addr: addr6, ID: anID,
		Hosts: map[netip.Addr]int{addr4: 1}, Arr: [3]byte{1, 2, 3}, N: -5, Temp: 20, Raw: json.RawMessage(`{"a":[1]}`),
		Keys: map[int]string{-1: "x"}, Any: map[string]any{"t": at}}
	raw := envelope.MustRaw(in)
	got, err := decodeInput[all](raw, shapeOf(reflect.TypeFor[all]()))
	if err != nil {
		t.Fatal(err)
	}
	want := in
	want.Any = map[string]any{"t": "2026-11-30T10:00:00Z"} // an interface gets what encoding/json gives
	if !got.At.Equal(want.At) {
		t.Errorf("at %v, want %v", got.At, want.At)
	}
	got.At, want.At = time.Time{}, time.Time{}
	if !reflect.DeepEqual(*got, want) {
		t.Errorf("decoded\n %#v\nwant\n %#v", *got, want)
	}
}

// Refusals list every issue, each with its path: the strict checks stay
// strict with the new forms.
func TestJSONInput_EveryIssueWithItsPath(t *testing.T) {
	type order struct {
		At    time.Time          `json:"at"`
		Every time.Duration      `json:"every"`
		Tags  map[uint8]string   `json:"tags"`
		Items []struct{ Q int8 } `json:"items"`
		Blob  []byte             `json:"blob"`
		Addr  netip.Addr         `json:"addr"`
	}
	raw, err := envelope.RawFromJSON([]byte(`{"at":"noon","every":"often","tags":{"300":"x","1":"y"},` +
		`"items":[{"Q":1},{"Q":200,"R":1}],"blob":"%%","addr":"::g","extra":{}}`))
	if err != nil {
		t.Fatal(err)
	}
	_, err = decodeInput[order](raw, shapeOf(reflect.TypeFor[order]()))
	var ie *InputError
	if !errors.As(err, &ie) {
		t.Fatalf("accepted: %v", err)
	}
	var got []string
	for _, is := range ie.Issues {
		got = append(got, is.Path)
	}
	want := []string{"addr", "at", "blob", "every", "extra", "items[1].Q", "items[1].R", `tags["300"]`}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("paths %v, want %v; issues %+v", got, want, ie.Issues)
	}
}

// fuzzRich holds every kind of type an input declares, nested and recursive.
type fuzzRich struct {
	At     time.Time              `json:"at,omitzero"`
	Every  time.Duration          `json:"every,omitempty"`
	I8     int8                   `json:"i8,omitempty"`
	U16    uint16                 `json:"u16,omitempty"`
	I64    int64                  `json:"i64,omitempty"`
	U64    uint64                 `json:"u64,omitempty"`
	F32    float32                `json:"f32,omitempty"`
	F64    float64                `json:"f64,omitempty"`
	OK     bool                   `json:"ok,omitempty"`
	S      string                 `json:"s,omitempty"`
	Blob   []byte                 `json:"blob,omitempty"`
	Ptr    *int32                 `json:"ptr,omitempty"`
	Tags   map[string]int         `json:"tags,omitempty"`
	Keys   map[uint8]string       `json:"keys,omitempty"`
	Hosts  map[netip.Addr]bool    `json:"hosts,omitempty"`
	List   []fuzzRich             `json:"list,omitempty"`
	Pair   [2]float32             `json:"pair,omitzero"`
	Raw    json.RawMessage        `json:"raw,omitempty"`
	Temp   celsius                `json:"temp,omitempty"`
	Addr   netip.Addr             `json:"addr,omitzero"`
	ID     uuid.UUID              `json:"id,omitzero"`
	Quoted int16                  `json:"quoted,string,omitempty"`
	Any    any                    `json:"any,omitempty"`
	Deep   map[string][]*fuzzRich `json:"deep,omitempty"`
	Must   int                    `json:"must"` // required
	fuzzPart
}

type fuzzPart struct {
	Note string `json:"note,omitempty"`
}

// Random JSON documents against a rich input type: nothing panics, an input
// is either decoded or refused with an *InputError (which the executor ends as
// INPUT_INVALID) listing its issues, each with a message and (inside an
// object) a path, and the decoder never refuses what the check accepted.
func FuzzJSONInput(f *testing.F) {
	for _, seed := range []string{
		`{"must":1,"at":"2026-11-30T10:00:00Z","every":"1h","i8":-1,"u16":65535,"blob":"AAE=","ptr":null}`,
		`{"must":0,"tags":{"a":1},"keys":{"255":"x"},"hosts":{"::1":true},"list":[{"must":1,"s":"x","list":[{"must":2}]}],"pair":[1.5,2]}`,
		`{"must":1,"raw":{"any":[1,"x"]},"temp":"20C","addr":"10.0.0.1","id":"0190d6c8-8b7e-7c3a-9f4e-2b1d3c4e5f60","quoted":"12"}`,
		`{"must":1,"any":{"x":[1,2.5,null,true]},"deep":{"k":[null,{"must":1,"note":"n"}]},"note":"n","f32":3.4e38,"u64":18446744073709551615}`,
		`{"i8":300,"every":"soon","at":"noon","blob":"!","quoted":"x","bogus":1,"list":[{"u16":-1}]}`,
		`[1,2]`, `"x"`, `null`, `{"f64":1e400}`, `{"i64":1e30}`,
	} {
		f.Add([]byte(seed))
	}
	s := shapeOf(reflect.TypeFor[fuzzRich]())
	f.Fuzz(func(t *testing.T, doc []byte) {
		raw, err := envelope.RawFromJSON(doc)
		if err != nil || len(raw) == 0 {
			return // not JSON: the client refuses it before it is sent
		}
		in, err := decodeInput[fuzzRich](raw, s)
		if err == nil {
			if _, err := json.Marshal(in); err != nil {
				t.Fatalf("accepted %s, but it does not write back: %v", doc, err)
			}
			return
		}
		var ie *InputError
		if !errors.As(err, &ie) || len(ie.Issues) == 0 {
			t.Fatalf("%s: refused without issues: %v", doc, err)
		}
		object := bytes.HasPrefix(bytes.TrimSpace(doc), []byte("{"))
		for _, is := range ie.Issues {
			if is.Message == "" || object && is.Path == "" && !strings.HasPrefix(is.Message, "more than") {
				t.Fatalf("%s: issue %+v", doc, is)
			}
			if is.Message == "the input does not match the capability's input type" {
				t.Fatalf("%s: the check accepted what the decoder refuses: %v", doc, err)
			}
		}
	})
}

// msgpackCounter decodes itself from msgpack only.
type msgpackCounter struct{ n int64 }

func (c *msgpackCounter) DecodeMsgpack(d *msgpack.Decoder) error {
	n, err := d.DecodeInt64()
	c.n = n
	return err
}

// An input type holding a type that only the msgpack library can decode is
// decoded by it, as before JSON had a meaning of its own.
func TestJSONInput_MsgpackOnlyTypeKeepsTheMsgpackDecoder(t *testing.T) {
	type in struct {
		Count msgpackCounter `json:"count"`
		Name  string         `json:"name"`
	}
	s := shapeOf(reflect.TypeFor[in]())
	if !decodesByMsgpack(s) || decodesByMsgpack(shapeOf(reflect.TypeFor[jsonIn[time.Time]]())) {
		t.Fatal("the decoder is chosen by the type's parts")
	}
	got, err := decodeInput[in](envelope.MustRaw(map[string]any{"count": 7, "name": "n"}), s)
	if err != nil || got.Count.n != 7 || got.Name != "n" {
		t.Fatalf("%+v, %v", got, err)
	}
}
