package inputcheck

import (
	"encoding/json"
	"net/netip"
	"reflect"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/capstan-dev/capstan/envelope"
)

// One walk both checks an input and writes the JSON that encoding/json
// decodes: for any bytes, checking alone and checking while writing find the
// same issues in the same order, and what the walk writes for an input
// without issues is one JSON value that encoding/json decodes into the input
// type. Seeds are agents' JSON and Go clients' msgpack of the same type.
func FuzzWalk_CheckingAndWritingAgree(f *testing.F) {
	for _, doc := range []string{
		`{"must":1,"at":"2026-11-30T10:00:00Z","every":"1h","i8":-1,"u16":65535,"blob":"AAE=","ptr":null}`,
		`{"must":0,"tags":{"a":1},"keys":{"255":"x"},"hosts":{"::1":true},"list":[{"must":1,"s":"x"}],"pair":[1.5,2]}`,
		`{"must":1,"raw":{"any":[1,"x"]},"temp":"20C","addr":"10.0.0.1","id":"0190d6c8-8b7e-7c3a-9f4e-2b1d3c4e5f60","quoted":"12"}`,
		`{"must":1,"any":{"x":[1,2.5,null,true]},"deep":{"k":[null,{"must":1,"note":"n"}]},"f32":3.4e38}`,
		`{"i8":300,"every":"soon","at":"noon","blob":"!","quoted":"x","bogus":1,"list":[{"u16":-1}]}`,
	} {
		raw, err := envelope.RawFromJSON([]byte(doc))
		if err != nil {
			f.Fatal(err)
		}
		f.Add([]byte(raw))
	}
	p := int32(5)
	for _, v := range []fuzzRich{
		{Must: 1, At: time.Date(2026, 11, 30, 10, 0, 0, 5, time.UTC), Every: time.Minute, Blob: []byte{0, 255}, Ptr: &p,
			Keys: map[uint8]string{7: "x"}, Hosts: map[netip.Addr]bool{netip.MustParseAddr("::1"): true}, F32: 0.1,
			Raw: json.RawMessage(`{"a":1}`), Addr: netip.MustParseAddr("10.0.0.1"), ID: uuid.New(), Quoted: -3},
		{Must: 2, Any: map[string]any{"t": time.Unix(9, 9), "b": []byte("hi")}, Pair: [2]float32{1.5, -2},
			List: []fuzzRich{{Must: 3, Temp: 21.5}}},
	} {
		b, err := msgpack.Marshal(v)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	s := shapeOf(reflect.TypeFor[fuzzRich]())
	f.Fuzz(func(t *testing.T, b []byte) {
		checked := checkInput(b, s)
		written, j := walk(b, s, true)
		if !reflect.DeepEqual(checked, written) {
			t.Fatalf("% x: checking finds %v, checking while writing %v", b, checked, written)
		}
		if len(checked) > 0 {
			return
		}
		if !json.Valid(j) {
			t.Fatalf("% x: accepted, written as %s, which is not JSON", b, j)
		}
		if err := json.Unmarshal(j, new(fuzzRich)); err != nil {
			t.Fatalf("% x: accepted, written as %s, which encoding/json refuses: %v", b, j, err)
		}
	})
}
