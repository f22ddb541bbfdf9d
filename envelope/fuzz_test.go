package envelope

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
	"time"
)

// fuzzSeeds are valid records, near misses and the crafted headers that once
// could exhaust memory or stack.
func fuzzSeeds(f *testing.F, valid ...any) {
	for _, v := range valid {
		b := mustMarshal(f, v)
		f.Add(b)
		f.Add(b[:len(b)/2])
		f.Add(append(bytes.Clone(b), 0xc1))
	}
	for _, b := range [][]byte{
		nil,
		{0xc0},
		{0xc1},
		{0x80},
		{0x81, 0xa1, 'v', 0x01},
		{0xdd, 0xff, 0xff, 0xff, 0xff},
		{0xdf, 0xff, 0xff, 0xff, 0xff},
		{0xdb, 0xff, 0xff, 0xff, 0xff},
		{0xc9, 0xff, 0xff, 0xff, 0xff, 0x01},
		bytes.Repeat([]byte{0x91}, 64),
		[]byte(`{"v":1,"executionId":"e1","capabilityId":"a"}`),
	} {
		f.Add(b)
	}
}

// FuzzDecodeRequest: DecodeRequest never panics, refuses with ErrDecode, and
// whatever it accepts re-encodes to a request that decodes to the same thing.
func FuzzDecodeRequest(f *testing.F) {
	full := fullRequest()
	fuzzSeeds(f,
		&full,
		&Request{V: Version, ExecutionID: "e1", CapabilityID: "demo.echo"},
		map[string]any{"v": 1, "executionId": "e1", "capabilityId": "a", "input": []any{1, "x", nil}, "extra": map[string]any{"k": 1.5}},
	)
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeRequest(b)
		if err != nil {
			if !errors.Is(err, ErrDecode) {
				t.Fatalf("error does not wrap ErrDecode: %v", err)
			}
			return
		}
		again := mustMarshal(t, r)
		r2, err := DecodeRequest(again)
		if err != nil {
			t.Fatalf("accepted request does not decode after re-encoding: %v\nrequest: %+v", err, r)
		}
		if !bytes.Equal(sortedEncode(t, r), sortedEncode(t, r2)) {
			t.Fatalf("re-encoding changed the request\nfirst:  %+v\nsecond: %+v", r, r2)
		}
	})
}

// FuzzDecodeEnvelope is FuzzDecodeRequest for envelopes.
func FuzzDecodeEnvelope(f *testing.F) {
	full := fullEnvelope()
	fuzzSeeds(f,
		&full,
		&Envelope{V: Version, ExecutionID: "e1", CapabilityID: "demo.echo", Status: StatusCompleted},
		map[string]any{"v": 1, "error": map[string]any{"code": "X", "details": map[string]any{"a": []any{1, 2.5, "s"}}}},
	)
	// Found by fuzzing: an integer key among string keys in a details map.
	f.Add([]byte("\x82\xa1v\x01\xa5error\x82\xa428A12\xa7details\x81\xa10\x82\xa110A2"))
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := DecodeEnvelope(b)
		if err != nil {
			if !errors.Is(err, ErrDecode) {
				t.Fatalf("error does not wrap ErrDecode: %v", err)
			}
			return
		}
		again := mustMarshal(t, e)
		e2, err := DecodeEnvelope(again)
		if err != nil {
			t.Fatalf("accepted envelope does not decode after re-encoding: %v\nenvelope: %+v", err, e)
		}
		if !bytes.Equal(sortedEncode(t, e), sortedEncode(t, e2)) {
			t.Fatalf("re-encoding changed the envelope\nfirst:  %+v\nsecond: %+v", e, e2)
		}
	})
}

// FuzzValidCapabilityID: the validator accepts exactly the design's grammar.
func FuzzValidCapabilityID(f *testing.F) {
	for _, id := range []string{"demo.echo", "a-b_c.d1", "a..b", "orders.*", "_unrouted", "Demo", "a.", ".a", "1abc"} {
		f.Add(id)
	}
	f.Fuzz(func(t *testing.T, id string) {
		want := capabilityIDPattern.MatchString(id) && len(id) <= MaxIDLen
		if err := ValidCapabilityID(id); (err == nil) != want {
			t.Fatalf("ValidCapabilityID(%q) = %v, grammar says valid=%v", id, err, want)
		}
	})
}

// FuzzRawFromJSON: any JSON accepted comes back out of Raw as JSON that reads
// to the same value, which is how the CLI and MCP clients see inputs.
func FuzzRawFromJSON(f *testing.F) {
	for _, j := range []string{`{"a":1}`, `[1,2.5,"x",null,true]`, `900`, `1e15`, `18446744073709551615`, `-0.0`, `{}}`, `"\u00e9"`} {
		f.Add([]byte(j))
	}
	f.Fuzz(func(t *testing.T, j []byte) {
		r, err := RawFromJSON(j)
		if err != nil || r == nil {
			return
		}
		out, err := r.MarshalJSON()
		if err != nil {
			t.Fatalf("accepted JSON %q does not render back: %v", j, err)
		}
		r2, err := RawFromJSON(out)
		if err != nil {
			t.Fatalf("rendered JSON %q does not read back: %v", out, err)
		}
		c1, err1 := CanonicalJSON(r)
		c2, err2 := CanonicalJSON(r2)
		if (err1 == nil) != (err2 == nil) || !bytes.Equal(c1, c2) {
			t.Fatalf("JSON %q changed through Raw: %q (%v) vs %q (%v)", j, c1, err1, c2, err2)
		}
	})
}

// FuzzDecodeRequestFast: whatever the direct reader of requests accepts, the
// reflective decoder decodes to the same request; the reader never panics.
func FuzzDecodeRequestFast(f *testing.F) {
	full := fullRequest()
	deadline := full.SubmittedAt.Add(time.Minute)
	fuzzSeeds(f,
		&full,
		&Request{V: Version, ExecutionID: "e1", CapabilityID: "demo.echo"},
		&Request{V: Version, ExecutionID: "e1", CapabilityID: "a", Deadline: &deadline, StartBy: &deadline,
			Actor: Actor{ID: "u", Kind: ActorUser, Attrs: map[string]string{"team": "x"}}},
		map[string]any{"v": 1, "executionId": "e1", "capabilityId": "a", "input": []any{1, "x", nil}, "extra": map[string]any{"k": 1.5}},
		map[string]any{"v": -3, "deadline": nil, "actor": map[string]any{"id": "a", "other": 1}, "submittedAt": time.Time{}},
	)
	f.Fuzz(func(t *testing.T, b []byte) {
		fast, ok := decodeRequestFast(b)
		if !ok {
			return
		}
		var slow Request
		if err := Unmarshal(b, &slow); err != nil {
			t.Fatalf("the direct reader accepts what the decoder refuses: %v\nrequest: %+v", err, fast)
		}
		if !reflect.DeepEqual(fast, slow) {
			t.Fatalf("the two decoders disagree\ndirect:     %+v\nreflective: %+v", fast, slow)
		}
	})
}

// FuzzDecodeEnvelopeFast: whatever the direct reader of envelopes accepts,
// the reflective decoder decodes to the same envelope; the reader never
// panics.
func FuzzDecodeEnvelopeFast(f *testing.F) {
	done := fullEnvelope()
	done.Status, done.Error, done.Approval = StatusCompleted, nil, nil
	failed := fullEnvelope()
	failed.Approval, failed.Error.Details = nil, nil
	fuzzSeeds(f,
		&done,
		&failed,
		fullEnvelope(),
		&Envelope{V: Version, ExecutionID: "e1", Status: StatusCompleted},
		map[string]any{"v": 1, "executionId": "e1", "error": nil, "approval": nil, "recovered": nil, "extra": []any{1, "x"}},
		map[string]any{"v": 1, "error": map[string]any{"code": "X", "retryable": 1, "details": nil, "stage": nil, "other": true}},
		map[string]any{"v": -3, "durationMs": 1 << 40, "output": nil, "finalizedAt": time.Time{}, "status": 7},
	)
	f.Fuzz(func(t *testing.T, b []byte) {
		fast, ok := decodeEnvelopeFast(b)
		if !ok {
			return
		}
		var slow Envelope
		if err := Unmarshal(b, &slow); err != nil {
			t.Fatalf("the direct reader accepts what the decoder refuses: %v\nenvelope: %+v", err, fast)
		}
		if !reflect.DeepEqual(fast, slow) {
			t.Fatalf("the two decoders disagree\ndirect:     %+v\nreflective: %+v", fast, slow)
		}
	})
}
