package envelope

import (
	"reflect"
	"testing"
)

// A request as clients write it is read directly, and reads as the
// reflective decoder reads it; a form the direct reader does not take (a
// repeated key) is still decoded, by the reflective decoder.
func TestDecodeRequest_ClientsFormIsReadDirectlyAndAlike(t *testing.T) {
	full := fullRequest()
	b := mustMarshal(t, &full)
	fast, ok := decodeRequestFast(b)
	if !ok {
		t.Fatal("the direct reader refused a request as clients write it")
	}
	var slow Request
	if err := Unmarshal(b, &slow); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(fast, slow) {
		t.Fatalf("direct %+v\nreflective %+v", fast, slow)
	}
	// {"v":1,"v":1,"executionId":…,"capabilityId":"a"}: v twice.
	twice := append([]byte{0x84, 0xa1, 'v', 0x01, 0xa1, 'v', 0x01}, mustMarshal(t, map[string]any{"executionId": testExecutionID})[1:]...)
	twice = append(twice, mustMarshal(t, map[string]any{"capabilityId": "a"})[1:]...)
	if _, ok := decodeRequestFast(twice); ok {
		t.Fatal("the direct reader took a repeated key")
	}
	r, err := DecodeRequest(twice)
	if err != nil || r.CapabilityID != "a" || r.ExecutionID != testExecutionID {
		t.Fatalf("DecodeRequest of a repeated key: %+v, %v", r, err)
	}
}
