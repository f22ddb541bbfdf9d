package envelope

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

const testExecutionID = "0190f0a4-5c1e-7c3a-9b2d-1f2e3d4c5b6a"

// fullRequest sets every field, so that a field dropped by the codec shows.
func fullRequest() Request {
	deadline := time.Date(2026, 3, 1, 12, 0, 30, 0, time.UTC)
	return Request{
		V:             Version,
		ExecutionID:   testExecutionID,
		CapabilityID:  "orders.refund",
		Input:         MustRaw(map[string]any{"orderId": "o-42", "amount": 900}),
		Actor:         Actor{ID: "alice", Kind: ActorUser, Attrs: map[string]string{"tenant": "acme"}},
		Surface:       "mcp",
		CorrelationID: "corr-1",
		SubmittedAt:   time.Date(2026, 3, 1, 12, 0, 0, 123456789, time.UTC),
		Deadline:      &deadline,
		ApprovalID:    "appr-7",
		Traceparent:   "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
	}
}

// fullEnvelope sets every field, nested ones included.
func fullEnvelope() Envelope {
	return Envelope{
		V:            Version,
		ExecutionID:  testExecutionID,
		CapabilityID: "orders.refund",
		Status:       StatusFailed,
		Output:       MustRaw(map[string]any{"refundId": "r-1", "total": 900, "items": []any{"a", "b"}}),
		Error: &Error{
			Code:          CodeInputInvalid,
			Message:       "amount must be positive",
			Retryable:     true,
			ExposeToModel: true,
			Details:       map[string]any{"field": "amount"},
			Stage:         StageInput,
		},
		Attempts: 2,
		Approval: &ApprovalRef{
			ID:        "appr-7",
			Reasons:   []string{"amount over limit"},
			Types:     []string{"manager"},
			ExpiresAt: time.Date(2026, 3, 2, 12, 0, 0, 0, time.UTC),
		},
		DurationMs:  1234,
		FinalizedBy: "worker-1",
		FinalizedAt: time.Date(2026, 3, 1, 12, 0, 1, 500, time.UTC),
	}
}

// msgpack decodes times in the local zone; the instant is what travels.
func utcRequest(r Request) Request {
	r.SubmittedAt = r.SubmittedAt.UTC()
	if r.Deadline != nil {
		d := r.Deadline.UTC()
		r.Deadline = &d
	}
	return r
}

func utcEnvelope(e Envelope) Envelope {
	e.FinalizedAt = e.FinalizedAt.UTC()
	if e.Approval != nil {
		a := *e.Approval
		a.ExpiresAt = a.ExpiresAt.UTC()
		e.Approval = &a
	}
	return e
}

func mustMarshal(t testing.TB, v any) []byte {
	t.Helper()
	b, err := Marshal(v)
	if err != nil {
		t.Fatalf("Marshal: %v", err)
	}
	return b
}

// wireMap decodes a record into plain maps, as another language would see it.
func wireMap(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := Unmarshal(b, &m); err != nil {
		t.Fatalf("Unmarshal into map: %v", err)
	}
	return m
}

func keysOf(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func sorted(s ...string) []string {
	slices.Sort(s)
	return s
}

func TestRequest_RoundTrip(t *testing.T) {
	minimal := Request{V: Version, ExecutionID: "e1", CapabilityID: "demo.echo", Actor: Actor{Kind: ActorAnonymous}}
	for name, want := range map[string]Request{"full": fullRequest(), "minimal": minimal} {
		t.Run(name, func(t *testing.T) {
			got, err := DecodeRequest(mustMarshal(t, &want))
			if err != nil {
				t.Fatalf("DecodeRequest: %v", err)
			}
			if !reflect.DeepEqual(utcRequest(*got), utcRequest(want)) {
				t.Errorf("round trip changed the request\n got: %+v\nwant: %+v", *got, want)
			}
		})
	}
}

func TestEnvelope_RoundTrip(t *testing.T) {
	minimal := Envelope{V: Version, ExecutionID: "e1", CapabilityID: "demo.echo", Status: StatusCompleted}
	for name, want := range map[string]Envelope{"full": fullEnvelope(), "minimal": minimal} {
		t.Run(name, func(t *testing.T) {
			got, err := DecodeEnvelope(mustMarshal(t, &want))
			if err != nil {
				t.Fatalf("DecodeEnvelope: %v", err)
			}
			// Details come back with msgpack's compact integer types, so they are
			// compared as they encode; the rest field by field.
			if !bytes.Equal(sortedEncode(t, got), sortedEncode(t, &want)) {
				t.Errorf("round trip changed the encoding\n got: %x\nwant: %x", sortedEncode(t, got), sortedEncode(t, &want))
			}
			g, w := utcEnvelope(*got), utcEnvelope(want)
			if g.Error != nil && w.Error != nil {
				ge, we := *g.Error, *w.Error
				ge.Details, we.Details = nil, nil
				g.Error, w.Error = &ge, &we
			}
			if !reflect.DeepEqual(g, w) {
				t.Errorf("round trip changed the envelope\n got: %+v\nwant: %+v", g, w)
			}
		})
	}
}

func TestWire_FieldNamesAreJSONTags(t *testing.T) {
	req := fullRequest()
	m := wireMap(t, mustMarshal(t, &req))
	if got, want := keysOf(m), sorted("v", "executionId", "capabilityId", "input", "actor", "surface",
		"correlationId", "submittedAt", "deadline", "approvalId", "traceparent"); !slices.Equal(got, want) {
		t.Errorf("request keys = %v, want %v", got, want)
	}
	if got, want := keysOf(m["actor"].(map[string]any)), sorted("id", "kind", "attrs"); !slices.Equal(got, want) {
		t.Errorf("actor keys = %v, want %v", got, want)
	}
	if m["executionId"] != testExecutionID || m["capabilityId"] != "orders.refund" {
		t.Errorf("ids on the wire = %v, %v", m["executionId"], m["capabilityId"])
	}

	env := fullEnvelope()
	m = wireMap(t, mustMarshal(t, &env))
	if got, want := keysOf(m), sorted("v", "executionId", "capabilityId", "status", "output", "error",
		"attempts", "approval", "durationMs", "finalizedBy", "finalizedAt"); !slices.Equal(got, want) {
		t.Errorf("envelope keys = %v, want %v", got, want)
	}
	if got, want := keysOf(m["error"].(map[string]any)), sorted("code", "message", "retryable",
		"exposeToModel", "details", "stage"); !slices.Equal(got, want) {
		t.Errorf("error keys = %v, want %v", got, want)
	}
	if got, want := keysOf(m["approval"].(map[string]any)), sorted("id", "reasons", "types", "expiresAt"); !slices.Equal(got, want) {
		t.Errorf("approval keys = %v, want %v", got, want)
	}
	if m["status"] != "failed" {
		t.Errorf("status on the wire = %v, want failed", m["status"])
	}
}

func TestWire_EveryRecordCarriesV(t *testing.T) {
	for name, rec := range map[string]any{
		"request":  &Request{V: Version, ExecutionID: "e1", CapabilityID: "a"},
		"envelope": &Envelope{V: Version, ExecutionID: "e1", CapabilityID: "a"},
	} {
		m := wireMap(t, mustMarshal(t, rec))
		if v, ok := m["v"]; !ok || reflect.ValueOf(v).Convert(reflect.TypeFor[int64]()).Int() != Version {
			t.Errorf("%s: v on the wire = %v (present %v), want %d", name, v, ok, Version)
		}
	}
}

// A Raw is the embedded value itself: a reader in another language sees a map
// where the input is a map, not a byte string it would have to decode again.
func TestRaw_EmbeddedAsValueNotByteString(t *testing.T) {
	req := fullRequest()
	in := wireMap(t, mustMarshal(t, &req))["input"]
	im, ok := in.(map[string]any)
	if !ok {
		t.Fatalf("input on the wire is %T, want map[string]any", in)
	}
	if im["orderId"] != "o-42" {
		t.Errorf("input.orderId = %v", im["orderId"])
	}

	for _, v := range []any{"a string", 42, []any{1, 2}} {
		env := Envelope{V: Version, ExecutionID: "e1", CapabilityID: "a", Output: MustRaw(v)}
		out := wireMap(t, mustMarshal(t, &env))["output"]
		if _, isBytes := out.([]byte); isBytes {
			t.Errorf("output %v embedded as a byte string", v)
		}
		if !bytes.Equal(mustMarshal(t, out), mustMarshal(t, v)) {
			t.Errorf("output on the wire = %#v, want %#v", out, v)
		}
	}
}

func TestDecode_UnknownFieldsIgnored(t *testing.T) {
	req := fullRequest()
	m := wireMap(t, mustMarshal(t, &req))
	m["futureField"] = map[string]any{"nested": []any{1, "two", nil}}
	m["zzz"] = 3
	b := mustMarshal(t, m)

	got, err := DecodeRequest(b)
	if err != nil {
		t.Fatalf("DecodeRequest with unknown fields: %v", err)
	}
	// The input went through a Go map above, so its keys may come in another
	// order: compare it as a value.
	gotIn, _ := got.Input.Value()
	wantIn, _ := req.Input.Value()
	if !reflect.DeepEqual(gotIn, wantIn) {
		t.Errorf("input = %v, want %v", gotIn, wantIn)
	}
	got.Input = req.Input
	if !reflect.DeepEqual(utcRequest(*got), utcRequest(req)) {
		t.Errorf("unknown fields changed the request\n got: %+v\nwant: %+v", *got, req)
	}

	var strict Request
	if err := UnmarshalStrict(b, &strict); !errors.Is(err, ErrDecode) {
		t.Errorf("UnmarshalStrict with unknown fields: err = %v, want ErrDecode", err)
	}
}

func TestDecode_WrongVersionRefused(t *testing.T) {
	for _, v := range []any{nil, 0, 2, -1, "1", []any{1}} {
		req := fullRequest()
		m := wireMap(t, mustMarshal(t, &req))
		if v == nil {
			delete(m, "v")
		} else {
			m["v"] = v
		}
		if _, err := DecodeRequest(mustMarshal(t, m)); !errors.Is(err, ErrDecode) {
			t.Errorf("request with v=%v: err = %v, want ErrDecode", v, err)
		}

		env := fullEnvelope()
		m = wireMap(t, mustMarshal(t, &env))
		if v == nil {
			delete(m, "v")
		} else {
			m["v"] = v
		}
		if _, err := DecodeEnvelope(mustMarshal(t, m)); !errors.Is(err, ErrDecode) {
			t.Errorf("envelope with v=%v: err = %v, want ErrDecode", v, err)
		}
	}
}

func TestDecodeRequest_RefusesInvalidIDs(t *testing.T) {
	tests := []struct {
		name string
		edit func(*Request)
	}{
		{"empty execution id", func(r *Request) { r.ExecutionID = "" }},
		{"execution id with a dot", func(r *Request) { r.ExecutionID = "a.b" }},
		{"execution id with a wildcard", func(r *Request) { r.ExecutionID = "*" }},
		{"execution id too long", func(r *Request) { r.ExecutionID = strings.Repeat("a", MaxIDLen+1) }},
		{"empty capability id", func(r *Request) { r.CapabilityID, r.ApprovalID = "", "" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := fullRequest()
			tt.edit(&req)
			if _, err := DecodeRequest(mustMarshal(t, &req)); !errors.Is(err, ErrDecode) {
				t.Errorf("err = %v, want ErrDecode", err)
			}
		})
	}
}

func TestDecode_GarbageIsErrDecodeNeverPanic(t *testing.T) {
	tests := map[string][]byte{
		"nil":           nil,
		"empty":         {},
		"never-used":    {0xc1},
		"nil value":     {0xc0},
		"integer":       {0x01},
		"string":        {0xa3, 'a', 'b', 'c'},
		"json":          []byte(`{"v":1,"executionId":"e1","capabilityId":"a"}`),
		"ext":           {0xd4, 0x05, 0x00},
		"v as map":      {0x81, 0xa1, 'v', 0x80},
		"array of junk": {0x93, 0xc1, 0xc1, 0xc1},
	}
	for name, b := range tests {
		t.Run(name, func(t *testing.T) {
			if _, err := DecodeRequest(b); !errors.Is(err, ErrDecode) {
				t.Errorf("DecodeRequest: err = %v, want ErrDecode", err)
			}
			if _, err := DecodeEnvelope(b); !errors.Is(err, ErrDecode) {
				t.Errorf("DecodeEnvelope: err = %v, want ErrDecode", err)
			}
		})
	}
}

func TestDecode_EveryTruncationIsErrDecode(t *testing.T) {
	req, env := fullRequest(), fullEnvelope()
	rb, eb := mustMarshal(t, &req), mustMarshal(t, &env)
	for n := range len(rb) {
		if _, err := DecodeRequest(rb[:n]); !errors.Is(err, ErrDecode) {
			t.Fatalf("request cut at %d of %d bytes: err = %v, want ErrDecode", n, len(rb), err)
		}
	}
	for n := range len(eb) {
		if _, err := DecodeEnvelope(eb[:n]); !errors.Is(err, ErrDecode) {
			t.Fatalf("envelope cut at %d of %d bytes: err = %v, want ErrDecode", n, len(eb), err)
		}
	}
}

// A few bytes of header can declare billions of elements. The msgpack library
// sizes some allocations from the declared length alone, and running out of
// memory or stack kills the process rather than panicking, so such records must
// be refused before decoding and with allocations in proportion to their size.
func TestDecode_CraftedLengthsRefusedWithoutHugeAllocation(t *testing.T) {
	// {"v":1,"error":{"details": <tail>}}
	envWithDetails := func(tail ...byte) []byte {
		b := []byte{0x82, 0xa1, 'v', 0x01, 0xa5, 'e', 'r', 'r', 'o', 'r', 0x81, 0xa7, 'd', 'e', 't', 'a', 'i', 'l', 's'}
		return append(b, tail...)
	}
	// {"v":1,"executionId":"e1","capabilityId":"a",<key>:<tail>}
	reqWith := func(key string, tail ...byte) []byte {
		b := []byte{0x84, 0xa1, 'v', 0x01, 0xab, 'e', 'x', 'e', 'c', 'u', 't', 'i', 'o', 'n', 'I', 'd', 0xa2, 'e', '1',
			0xac, 'c', 'a', 'p', 'a', 'b', 'i', 'l', 'i', 't', 'y', 'I', 'd', 0xa1, 'a', 0xa0 | byte(len(key))}
		b = append(b, key...)
		return append(b, tail...)
	}
	deep := func(depth int) []byte { return bytes.Repeat([]byte{0x91}, depth) } // [[[...

	tests := []struct {
		name   string
		decode func([]byte) error
		b      []byte
	}{
		{"details map of 2^31 entries", decodeEnvelopeErr, envWithDetails(0x81, 0xa1, 'x', 0xdf, 0x7f, 0xff, 0xff, 0xff)},
		{"details array of 2^32-1 elements", decodeEnvelopeErr, envWithDetails(0x81, 0xa1, 'x', 0xdd, 0xff, 0xff, 0xff, 0xff)},
		{"details itself a map of 2^32-1 entries", decodeEnvelopeErr, envWithDetails(0xdf, 0xff, 0xff, 0xff, 0xff)},
		{"reasons array of 2^32-1 strings", decodeEnvelopeErr, append([]byte{0x82, 0xa1, 'v', 0x01, 0xa8, 'a', 'p', 'p', 'r', 'o', 'v', 'a', 'l',
			0x81, 0xa7, 'r', 'e', 'a', 's', 'o', 'n', 's'}, 0xdd, 0xff, 0xff, 0xff, 0xff)},
		{"nested maps each of 2^31 entries", decodeEnvelopeErr, envWithDetails(bytes.Repeat([]byte{0xdf, 0x7f, 0xff, 0xff, 0xff, 0xa0}, 200)...)},
		{"attrs map of 2^32-1 entries", decodeRequestErr, reqWith("actor", 0x81, 0xa5, 'a', 't', 't', 'r', 's', 0xdf, 0xff, 0xff, 0xff, 0xff)},
		{"surface string of 4 GiB", decodeRequestErr, reqWith("surface", 0xdb, 0xff, 0xff, 0xff, 0xff)},
		{"input array of 2^32-1 elements", decodeRequestErr, reqWith("input", 0xdd, 0xff, 0xff, 0xff, 0xff)},
		{"input binary of 4 GiB", decodeRequestErr, reqWith("input", 0xc6, 0xff, 0xff, 0xff, 0xff)},
		{"input ext of 4 GiB", decodeRequestErr, reqWith("input", 0xc9, 0xff, 0xff, 0xff, 0xff, 0x01)},
		{"input nested past the limit", decodeRequestErr, reqWith("input", deep(maxDepth+1)...)},
		{"input nested 8M deep", decodeRequestErr, reqWith("input", deep(8<<20)...)},
		{"raw value of 2^32-1 elements", decodeRawErr, []byte{0xdd, 0xff, 0xff, 0xff, 0xff}},
		{"raw value nested past the limit", decodeRawErr, deep(maxDepth + 1)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			err := tt.decode(tt.b)
			runtime.ReadMemStats(&after)
			if !errors.Is(err, ErrDecode) {
				t.Errorf("err = %v, want ErrDecode", err)
			}
			// The limit is generous: it only has to tell "proportional to the
			// input" from "what the header asked for".
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > uint64(1<<20+4*len(tt.b)) {
				t.Errorf("decoding %d bytes allocated %d bytes", len(tt.b), alloc)
			}
		})
	}
}

// The msgpack library grows its pooled scratch buffer by a megabyte for each
// record that declares a string or binary longer than it holds, and keeps it;
// a stream of such 11-byte records once ran a worker out of memory.
func TestDecode_RepeatedOverlongRecordsAllocateLittle(t *testing.T) {
	b := []byte{0x82, 0xa1, 'v', 0x01, 0xa1, 'x', 0xc6, 0xff, 0xff, 0xff, 0xff} // {"v":1,"x":<bin32 of 4 GiB>}
	const n = 200
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range n {
		if _, err := DecodeRequest(b); !errors.Is(err, ErrDecode) {
			t.Fatalf("err = %v, want ErrDecode", err)
		}
	}
	runtime.ReadMemStats(&after)
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > n*4096 {
		t.Errorf("%d decodes of %d bytes allocated %d bytes", n, len(b), alloc)
	}
}

func decodeEnvelopeErr(b []byte) error { _, err := DecodeEnvelope(b); return err }
func decodeRequestErr(b []byte) error  { _, err := DecodeRequest(b); return err }
func decodeRawErr(b []byte) error      { _, err := Raw(b).Value(); return err }

func TestDecode_NestingUpToTheLimitAccepted(t *testing.T) {
	b := append(bytes.Repeat([]byte{0x91}, maxDepth-1), 0x90) // maxDepth arrays, the innermost empty
	v, err := Raw(b).Value()
	if err != nil {
		t.Fatalf("value nested %d deep: %v", maxDepth, err)
	}
	depth := 0
	for x, ok := v.([]any); ok; x, ok = v.([]any) {
		depth++
		if len(x) == 0 {
			break
		}
		v = x[0]
	}
	if depth != maxDepth {
		t.Errorf("decoded depth = %d, want %d", depth, maxDepth)
	}
}

// msgpack leaves a decoder recording every byte it reads after a raw value
// failed to decode midway; a pooled decoder in that state would copy every byte
// of every later record it decodes.
func TestUnmarshal_PooledDecoderNeverLeftRecording(t *testing.T) {
	req := fullRequest()
	b := mustMarshal(t, &req)
	cut := bytes.Index(b, []byte("orderId")) + 3 // inside the input
	for range 10 {
		if _, err := DecodeRequest(b[:cut]); !errors.Is(err, ErrDecode) {
			t.Fatalf("truncated input: err = %v, want ErrDecode", err)
		}
		d := decoders.Get().(*decoder)
		rec := reflect.ValueOf(d.dec).Elem().FieldByName("rec")
		if !rec.IsValid() {
			decoders.Put(d)
			t.Skip("msgpack.Decoder has no rec field any more")
		}
		if !rec.IsNil() {
			t.Fatalf("pooled decoder still records (%d bytes)", rec.Len())
		}
		decoders.Put(d)
	}
}

func TestJSON_AgreesWithMsgpack(t *testing.T) {
	env := fullEnvelope()
	j, err := json.Marshal(env)
	if err != nil {
		t.Fatalf("json.Marshal: %v", err)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(j, &fields); err != nil {
		t.Fatalf("json.Unmarshal into fields: %v", err)
	}
	// The output is the JSON value itself, not base64 of its msgpack bytes.
	if got, want := string(fields["output"]), `{"items":["a","b"],"refundId":"r-1","total":900}`; got != want {
		t.Errorf("output in JSON = %s, want %s", got, want)
	}
	if got, want := keysOf(mapOfRaw(fields)), keysOf(wireMap(t, mustMarshal(t, &env))); !slices.Equal(got, want) {
		t.Errorf("JSON keys %v differ from msgpack keys %v", got, want)
	}

	var back Envelope
	if err := json.Unmarshal(j, &back); err != nil {
		t.Fatalf("json.Unmarshal: %v", err)
	}
	gotOut, err := back.Output.Value()
	if err != nil {
		t.Fatalf("output after JSON: %v", err)
	}
	wantOut, _ := env.Output.Value()
	if !reflect.DeepEqual(gotOut, wantOut) {
		t.Errorf("output after JSON = %#v, want %#v", gotOut, wantOut)
	}
	var out struct {
		Total int `json:"total"`
	}
	if err := back.Output.Decode(&out); err != nil || out.Total != 900 {
		t.Errorf("output.total after JSON = %d (err %v), want the integer 900", out.Total, err)
	}
	// Everything else survives too; the output was checked above.
	back.Output, env.Output = nil, nil
	if !reflect.DeepEqual(back, env) {
		t.Errorf("JSON round trip changed the envelope\n got: %+v\nwant: %+v", back, env)
	}
}

func mapOfRaw(m map[string]json.RawMessage) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func TestRaw_JSONRoundTrip(t *testing.T) {
	tests := []struct{ in, want string }{
		{`null`, `null`},
		{`true`, `true`},
		{`900`, `900`},
		{`-5`, `-5`},
		{`1.5`, `1.5`},
		{`9007199254740993`, `9007199254740993`},
		{`-9223372036854775808`, `-9223372036854775808`},
		{`18446744073709551615`, `18446744073709551615`},
		{`"héllo"`, `"héllo"`},
		{`[1, "a", null, {}]`, `[1,"a",null,{}]`},
		{` {"b": {"c": []}, "a": 1} `, `{"a":1,"b":{"c":[]}}`},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			r, err := RawFromJSON([]byte(tt.in))
			if err != nil {
				t.Fatalf("RawFromJSON: %v", err)
			}
			j, err := json.Marshal(r)
			if err != nil {
				t.Fatalf("json.Marshal: %v", err)
			}
			if string(j) != tt.want {
				t.Errorf("JSON = %s, want %s", j, tt.want)
			}
			var back Raw
			if err := json.Unmarshal(j, &back); err != nil {
				t.Fatalf("json.Unmarshal: %v", err)
			}
			gotV, err := back.Value()
			if err != nil {
				t.Fatalf("Value after JSON: %v", err)
			}
			wantV, _ := r.Value()
			if !reflect.DeepEqual(gotV, wantV) {
				t.Errorf("value after JSON = %#v, want %#v", gotV, wantV)
			}
		})
	}
}

func TestRawFromJSON_KeepsIntegersAsIntegers(t *testing.T) {
	r, err := RawFromJSON([]byte(`{"amount": 900, "neg": -3, "big": 9007199254740993, "huge": 18446744073709551615, "ratio": 0.5, "whole": 2.0}`))
	if err != nil {
		t.Fatalf("RawFromJSON: %v", err)
	}
	var in struct {
		Amount int     `json:"amount"`
		Neg    int64   `json:"neg"`
		Big    int64   `json:"big"`
		Huge   uint64  `json:"huge"`
		Ratio  float64 `json:"ratio"`
		Whole  float64 `json:"whole"`
	}
	if err := r.Decode(&in); err != nil {
		t.Fatalf("Decode: %v", err)
	}
	if in.Amount != 900 || in.Neg != -3 || in.Big != 9007199254740993 || in.Huge != 18446744073709551615 || in.Ratio != 0.5 || in.Whole != 2 {
		t.Errorf("decoded %+v", in)
	}

	v, _ := r.Value()
	for _, k := range []string{"amount", "neg", "big", "huge"} {
		switch reflect.ValueOf(v.(map[string]any)[k]).Kind() {
		case reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		default:
			t.Errorf("%s decodes as %T, want an integer", k, v.(map[string]any)[k])
		}
	}
}

func TestRawFromJSON_RefusesInvalidJSON(t *testing.T) {
	for _, in := range []string{
		`{`, `{"a":}`, `[1,2`, `nul`, `'a'`, `{a:1}`, `[1,]`,
		`1 2`, `{} {}`, `{}}`, `[1]]`, `1 }`, `"a" x`,
		`1e400`, `-1e400`,
	} {
		if r, err := RawFromJSON([]byte(in)); err == nil {
			t.Errorf("RawFromJSON(%s) = %x, want an error", in, []byte(r))
		}
	}
}

func TestRawFromJSON_EmptyIsNoValue(t *testing.T) {
	for _, in := range []string{"", "  \n\t"} {
		r, err := RawFromJSON([]byte(in))
		if err != nil || r != nil {
			t.Errorf("RawFromJSON(%q) = %x, %v; want nil, nil", in, []byte(r), err)
		}
	}
}

// Maps written by other languages may have non-string keys; they decode, and
// render in JSON with their keys as text.
func TestRaw_NonStringMapKeys(t *testing.T) {
	r := MustRaw(map[int]string{1: "one"})
	v, err := r.Value()
	if err != nil {
		t.Fatalf("Value: %v", err)
	}
	if m, ok := v.(map[any]any); !ok || m[int64(1)] != "one" {
		t.Errorf("Value = %#v, want map[any]any{1: \"one\"}", v)
	}
	j, err := json.Marshal(r)
	if err != nil || string(j) != `{"1":"one"}` {
		t.Errorf("JSON = %s, %v; want {\"1\":\"one\"}", j, err)
	}

	// 7 as int8 and 7 as int64 are one key, as they are one number.
	b := []byte{0x83, 0x07, 0xa1, 'a', 0xd3, 0, 0, 0, 0, 0, 0, 0, 0x07, 0xa1, 'b', 0xa1, 'k', 0xa1, 'c'} // {7:"a", int64 7:"b", "k":"c"}
	v, err = Raw(b).Value()
	if err != nil {
		t.Fatalf("Value: %v", err)
	}
	if want := (map[any]any{int64(7): "b", "k": "c"}); !reflect.DeepEqual(v, want) {
		t.Errorf("Value = %#v, want %#v", v, want)
	}
}

// An unsigned key is one key with the signed number it equals (a key written
// as msgpack uint64 by another language), up to the largest int64; above it,
// it stays a key of its own.
func TestRaw_UnsignedMapKeysMergeWithTheirSignedForm(t *testing.T) {
	u64 := func(v uint64) []byte {
		return []byte{0xcf, byte(v >> 56), byte(v >> 48), byte(v >> 40), byte(v >> 32), byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}
	}
	i64 := func(v int64) []byte { return append([]byte{0xd3}, u64(uint64(v))[1:]...) }
	b := []byte{0x86}
	for _, kv := range []struct {
		key []byte
		val byte
	}{
		{[]byte{0x07}, 'a'}, {u64(7), 'b'}, // 7 twice: one key, the last value
		{i64(math.MaxInt64), 'c'}, {u64(math.MaxInt64), 'd'}, // the largest int64 twice
		{u64(math.MaxInt64 + 1), 'e'}, {i64(math.MinInt64), 'f'}, // the same 64 bits, two numbers
	} {
		b = append(append(b, kv.key...), 0xa1, kv.val)
	}
	v, err := Raw(b).Value()
	if err != nil {
		t.Fatalf("Value: %v", err)
	}
	want := map[any]any{int64(7): "b", int64(math.MaxInt64): "d", uint64(math.MaxInt64 + 1): "e", int64(math.MinInt64): "f"}
	if !reflect.DeepEqual(v, want) {
		t.Errorf("Value = %#v, want %#v", v, want)
	}
}

func TestRaw_NilAndEmpty(t *testing.T) {
	env := Envelope{V: Version, ExecutionID: "e1", CapabilityID: "a", Output: nil}
	if _, ok := wireMap(t, mustMarshal(t, &env))["output"]; ok {
		t.Error("a nil output is on the wire")
	}
	j, _ := json.Marshal(Raw(nil))
	if string(j) != "null" {
		t.Errorf("JSON of nil Raw = %s, want null", j)
	}
	var r Raw = Raw{1}
	if err := json.Unmarshal([]byte(" null "), &r); err != nil || r != nil {
		t.Errorf("Raw from JSON null = %x, %v; want nil", []byte(r), err)
	}
	if v, err := Raw(nil).Value(); v != nil || err != nil {
		t.Errorf("nil Raw Value = %v, %v", v, err)
	}
	// An explicit msgpack nil decodes to a nil Raw.
	b := mustMarshal(t, map[string]any{"v": 1, "executionId": "e1", "capabilityId": "a", "output": nil})
	got, err := DecodeEnvelope(b)
	if err != nil || got.Output != nil {
		t.Errorf("output nil on the wire: %x, %v", []byte(got.Output), err)
	}
}

func TestCodec_ConcurrentUseIsSafe(t *testing.T) {
	req, env := fullRequest(), fullEnvelope()
	wantReq, wantEnv := mustMarshal(t, &req), mustMarshal(t, &env)
	done := make(chan error, 8)
	for g := range 8 {
		go func() {
			for range 200 {
				if _, err := Marshal(&req); err != nil {
					done <- err
					return
				}
				if g%2 == 0 {
					r, err := DecodeRequest(wantReq)
					if err != nil || r.CapabilityID != req.CapabilityID {
						done <- errors.Join(err, errors.New("request decoded wrong"))
						return
					}
				} else {
					e, err := DecodeEnvelope(wantEnv)
					if err != nil || e.DurationMs != env.DurationMs {
						done <- errors.Join(err, errors.New("envelope decoded wrong"))
						return
					}
				}
				if _, err := DecodeRequest(wantReq[:len(wantReq)/2]); !errors.Is(err, ErrDecode) {
					done <- err
					return
				}
			}
			done <- nil
		}()
	}
	for range 8 {
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
}

// sortedEncode encodes like Marshal but with map keys sorted, so that two equal
// values give equal bytes. Maps with keys that are not strings, which msgpack
// does not sort, are written as their sorted encoded entries.
func sortedEncode(t testing.TB, v any) []byte {
	t.Helper()
	switch x := v.(type) {
	case *Envelope:
		if x != nil && x.Error != nil {
			e, ee := *x, *x.Error
			ee.Details = sortableDetails(t, ee.Details)
			e.Error = &ee
			v = &e
		}
	case map[string]any:
		v = sortableDetails(t, x)
	}
	return encodeSorted(t, v)
}

func sortableDetails(t testing.TB, m map[string]any) map[string]any {
	if m == nil {
		return nil
	}
	out := make(map[string]any, len(m))
	for k, x := range m {
		out[k] = sortable(t, x)
	}
	return out
}

func sortable(t testing.TB, v any) any {
	switch x := v.(type) {
	case map[string]any:
		return sortableDetails(t, x)
	case []any:
		out := make([]any, len(x))
		for i, y := range x {
			out[i] = sortable(t, y)
		}
		return out
	case map[any]any:
		entries := make([][]byte, 0, len(x))
		for k, y := range x {
			entries = append(entries, encodeSorted(t, []any{sortable(t, k), sortable(t, y)}))
		}
		slices.SortFunc(entries, bytes.Compare)
		return append([]any{"map[any]any"}, anySlice(entries)...)
	}
	return v
}

func anySlice(bs [][]byte) []any {
	out := make([]any, len(bs))
	for i, b := range bs {
		out[i] = b
	}
	return out
}

func encodeSorted(t testing.TB, v any) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	enc.SetCustomStructTag("json")
	enc.SetOmitEmpty(true)
	enc.UseCompactInts(true)
	enc.SetSortMapKeys(true)
	if err := enc.Encode(v); err != nil {
		t.Fatalf("encode: %v", err)
	}
	return buf.Bytes()
}

// A resume may name only its approval: the workers read the call from it.
func TestDecodeRequest_ResumeNamingOnlyItsApproval(t *testing.T) {
	req := fullRequest()
	req.CapabilityID, req.Input = "", nil
	got, err := DecodeRequest(mustMarshal(t, &req))
	if err != nil || got.ApprovalID != req.ApprovalID || got.CapabilityID != "" {
		t.Fatalf("got %+v, %v", got, err)
	}
}
