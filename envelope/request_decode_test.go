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

// An envelope as workers write it for a call that completed or failed is
// read directly, and reads as the reflective decoder reads it; one with an
// approval, a recovery or an error's details, or a repeated key, is left to
// the reflective decoder, and DecodeEnvelope still decodes it.
func TestDecodeEnvelope_WorkersFormIsReadDirectlyAndAlike(t *testing.T) {
	done := fullEnvelope()
	done.Status, done.Error, done.Approval = StatusCompleted, nil, nil
	failed := fullEnvelope()
	failed.Output, failed.Approval, failed.Error.Details = nil, nil, nil
	for _, e := range []Envelope{done, failed, {V: Version, ExecutionID: testExecutionID, Status: StatusCompleted}} {
		b := mustMarshal(t, &e)
		fast, ok := decodeEnvelopeFast(b)
		if !ok {
			t.Fatalf("the direct reader refused an envelope as workers write it: %+v", e)
		}
		var slow Envelope
		if err := Unmarshal(b, &slow); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(fast, slow) {
			t.Fatalf("direct %+v\nreflective %+v", fast, slow)
		}
	}
	for _, e := range []Envelope{fullEnvelope(), func() Envelope {
		e := done
		e.Recovered = &Recovered{How: RecoveredByReceipt, Attempt: 1}
		return e
	}()} {
		b := mustMarshal(t, &e)
		if _, ok := decodeEnvelopeFast(b); ok {
			t.Fatalf("the direct reader took an envelope it leaves to the reflective decoder: %+v", e)
		}
		got, err := DecodeEnvelope(b)
		if err != nil || !reflect.DeepEqual(utcEnvelope(*got), utcEnvelope(e)) {
			t.Fatalf("DecodeEnvelope: %+v, %v; want %+v", got, err, e)
		}
	}
	// {"v":1,"v":1,"executionId":…}: v twice.
	twice := append([]byte{0x83, 0xa1, 'v', 0x01, 0xa1, 'v', 0x01}, mustMarshal(t, map[string]any{"executionId": testExecutionID})[1:]...)
	if _, ok := decodeEnvelopeFast(twice); ok {
		t.Fatal("the direct reader took a repeated key")
	}
	if e, err := DecodeEnvelope(twice); err != nil || e.ExecutionID != testExecutionID {
		t.Fatalf("DecodeEnvelope of a repeated key: %+v, %v", e, err)
	}
}
