package inputcheck

import (
	"encoding/json"
	"math"
	"reflect"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/capstan-dev/capstan/envelope"
)

// An input typed map[string]any is built from its bytes as encoding/json
// reads it from the walk's JSON: for any bytes the check accepts, the value
// built directly, when it can be, is the JSON's.
func FuzzPlainObject_AsTheJSONReads(f *testing.F) {
	for _, doc := range []string{
		`{"message":"hello","n":[1,2.5,-3,null,true,{"a":{}}],"big":18446744073709551615,"neg":-9223372036854775808}`,
		`{"k":1,"k":{"x":2}}`, `{"s":"\u2028<é>\n","e":[],"o":{}}`, `{}`,
	} {
		raw, err := envelope.RawFromJSON([]byte(doc))
		if err != nil {
			f.Fatal(err)
		}
		f.Add([]byte(raw))
	}
	for _, v := range []any{
		map[string]any{"t": time.Unix(9, 9), "b": []byte("hi"), "f": float32(0.1), "z": math.Copysign(0, -1)},
		map[any]any{1: "x"}, []any{1}, "x",
	} {
		b, err := msgpack.Marshal(v)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0x82, 0xa1, 'k', 0x01, 0xa1, 'k', 0xd0, 0x00})
	f.Add([]byte{0x81, 0xa1, 'k', 0xa2, 0xff, 0xfe})
	s := shapeOf(reflect.TypeFor[map[string]any]())
	f.Fuzz(func(t *testing.T, b []byte) {
		issues, j := walk(b, s, true)
		direct, ok := plainObject(b)
		if len(issues) > 0 || !ok {
			return // refused by the check (decodeInput never builds it), or left to the JSON
		}
		var want map[string]any
		if err := json.Unmarshal(j, &want); err != nil {
			t.Fatalf("% x: built directly, but its JSON %s does not decode: %v", b, j, err)
		}
		if !reflect.DeepEqual(direct, want) {
			t.Fatalf("% x:\ndirect %#v\n  JSON %#v", b, direct, want)
		}
	})
}

// decodeInput gives a capability that takes any object the value
// encoding/json reads, whether it is built from the bytes (plain types) or
// read from the JSON (a time, a byte string, a 32-bit float).
func TestDecodeInput_AnyObjectAsTheJSONReads(t *testing.T) {
	s := shapeOf(reflect.TypeFor[map[string]any]())
	for _, v := range []map[string]any{
		{"message": "hello", "n": []any{1, 2.5, -3, nil, true}, "o": map[string]any{"é": "\u2028"}},
		{"t": time.Unix(9, 9).UTC(), "b": []byte("hi"), "f": float32(0.1)},
	} {
		raw := envelope.MustRaw(v)
		got, err := decodeInput[map[string]any](raw, s)
		if err != nil {
			t.Fatal(err)
		}
		_, j := walk(raw, s, true)
		var want map[string]any
		if err := json.Unmarshal(j, &want); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(*got, want) {
			t.Fatalf("%v:\n got %#v\nwant %#v", v, *got, want)
		}
	}
	if _, ok := plainObject(envelope.MustRaw(map[string]any{"message": "hello", "n": []any{1, 2.5}})); !ok {
		t.Fatal("an object of plain values was not built directly")
	}
}
