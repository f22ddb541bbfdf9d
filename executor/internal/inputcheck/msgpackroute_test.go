package inputcheck

import (
	"bytes"
	"encoding/json"
	"net/netip"
	"reflect"
	"testing"

	"github.com/capstan-dev/capstan/envelope"
)

// An input type holding a msgpack-only type is decoded by the msgpack
// library, which reads a string into []byte as its bytes (not base64) and a
// string into a type with a binary form (netip.Addr) as that binary form.
// Such an input is refused, never decoded into another value than the one
// the check accepted: "::12" is not the address 58.58.49.50.
func TestJSONInput_MsgpackRouteNeverDecodesAnotherValue(t *testing.T) {
	type in struct {
		Count msgpackCounter  `json:"count"`
		Data  []byte          `json:"data,omitempty"`
		Addr  netip.Addr      `json:"addr,omitzero"`
		Raw   json.RawMessage `json:"raw,omitempty"`
	}
	type meaning struct { // in, as encoding/json reads it
		Data []byte          `json:"data,omitempty"`
		Addr netip.Addr      `json:"addr,omitzero"`
		Raw  json.RawMessage `json:"raw,omitempty"`
	}
	s := shapeOf(reflect.TypeFor[in]())
	for _, j := range []string{
		`{"count":1,"data":"aGk="}`,
		`{"count":1,"addr":"::12"}`,
		`{"count":1,"addr":"2001:db8::1:2:34"}`,
		`{"count":1,"raw":"123"}`,
	} {
		raw, err := envelope.RawFromJSON([]byte(j))
		if err != nil {
			t.Fatal(err)
		}
		var want meaning
		if err := json.Unmarshal([]byte(j), &want); err != nil {
			t.Fatal(err)
		}
		got, err := decodeInput[in](raw, s)
		if err != nil {
			continue // refused: nothing runs
		}
		if !bytes.Equal(got.Data, want.Data) || got.Addr != want.Addr || !bytes.Equal(got.Raw, want.Raw) {
			t.Errorf("%s decodes into %+v, encoding/json's meaning is %+v", j, got, want)
		}
	}
	// A Go client's msgpack of the same values still decodes.
	addr := netip.MustParseAddr("::12")
	got, err := decodeInput[in](envelope.MustRaw(map[string]any{"count": 1, "data": []byte("hi"), "addr": addr,
		"raw": json.RawMessage(`"123"`)}), s)
	if err != nil || string(got.Data) != "hi" || got.Addr != addr || string(got.Raw) != `"123"` {
		t.Errorf("a Go client's msgpack: %+v, %v", got, err)
	}
}
