package envelope

import (
	"bytes"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/internal/codectest"
	"github.com/vmihailenco/msgpack/v5"
)

// The hand-written encoders must write what the reflective encoder writes:
// plain* are the same types without their EncodeMsgpack methods.
type (
	plainRequest  Request
	plainEnvelope Envelope
)

func TestHandWrittenEncoders_WriteTheReflectiveEncodersBytes(t *testing.T) {
	zero := time.Time{}
	partialReq := Request{V: Version, ExecutionID: testExecutionID, CapabilityID: "demo.echo",
		Actor: Actor{Kind: ActorAnonymous}, SubmittedAt: time.Now().UTC(), Deadline: &zero}
	partialEnv := Envelope{V: Version, ExecutionID: testExecutionID, Status: StatusCompleted, Attempts: -3,
		DurationMs: 1 << 40, FinalizedAt: time.Now()}
	var filledReq Request
	codectest.Fill(&filledReq)
	var filledEnv Envelope
	codectest.Fill(&filledEnv)
	requests := map[string]Request{"full": fullRequest(), "zero": {}, "partial": partialReq, "every field": filledReq}
	for name, r := range requests {
		got, want := mustMarshal(t, &r), mustMarshal(t, (*plainRequest)(&r))
		if !bytes.Equal(got, want) {
			t.Errorf("request %s:\n got % x\nwant % x", name, got, want)
		}
		if byValue := mustMarshal(t, r); !bytes.Equal(byValue, want) {
			t.Errorf("request %s by value differs", name)
		}
	}
	envelopes := map[string]Envelope{"full": fullEnvelope(), "zero": {}, "partial": partialEnv, "every field": filledEnv}
	for name, e := range envelopes {
		got, want := mustMarshal(t, &e), mustMarshal(t, (*plainEnvelope)(&e))
		if !bytes.Equal(got, want) {
			t.Errorf("envelope %s:\n got % x\nwant % x", name, got, want)
		}
	}
	var nilEnv *Envelope
	if got := mustMarshal(t, nilEnv); !bytes.Equal(got, []byte{0xc0}) {
		t.Errorf("nil envelope: % x", got)
	}
}

// An error's details are written as a decoder reads them back: a handler's
// struct as a map with sorted keys, so that the envelope decoded and encoded
// again is the same bytes.
func TestErrorDetails_WrittenAsTheyDecode(t *testing.T) {
	type issue struct {
		Path    string `json:"path,omitempty"`
		Message string `json:"message"`
	}
	env := Envelope{V: Version, ExecutionID: testExecutionID, Status: StatusFailed, FinalizedAt: time.Unix(1, 0),
		Error: &Error{Code: CodeInputInvalid, Message: "The input is invalid.", ExposeToModel: true, Stage: StageInput,
			Details: map[string]any{"issues": []issue{{Path: "amount", Message: "want a number"}, {Message: "x"}}, "b": 1, "a": 2}}}
	b := mustMarshal(t, &env)
	got, err := DecodeEnvelope(b)
	if err != nil {
		t.Fatal(err)
	}
	if again := mustMarshal(t, got); !bytes.Equal(again, b) {
		t.Fatalf("decoded and encoded again:\n got % x\nwant % x", again, b)
	}
	if !bytes.Contains(b, []byte("\xa1a\x02\xa1b\x01")) || !bytes.Contains(b, []byte("\xa7message\xadwant a number\xa4path\xa6amount")) {
		t.Fatalf("details not written as sorted maps: % x", b)
	}
}

// A map[string]any written in place (an audit event's data) must be the
// bytes the reflective encoder writes for it, keys sorted: the trail's
// messages are hashed as stored.
func TestFieldsMap_WritesTheReflectiveEncodersBytes(t *testing.T) {
	rng := rand.New(rand.NewPCG(43, 1))
	str := func() string {
		n := []int{0, 1, 5, 31, 32, 255, 256, 65535, 65536}[rng.IntN(9)]
		if rng.IntN(20) > 0 {
			n = rng.IntN(40)
		}
		b := make([]byte, n)
		for i := range b {
			b[i] = "aAbz09._-é\x00"[rng.IntN(12)]
		}
		return string(b)
	}
	ints := []int64{0, 1, 127, 128, 255, 256, 65535, 65536, 1<<32 - 1, 1 << 32, math.MaxInt64,
		-1, -32, -33, -128, -129, -32768, -32769, math.MinInt32, math.MinInt32 - 1, math.MinInt64}
	var value func(depth int) any
	value = func(depth int) any {
		switch rng.IntN(14) {
		case 0:
			return nil
		case 1, 2:
			return str()
		case 3:
			return rng.IntN(2) == 1
		case 4:
			return int(ints[rng.IntN(len(ints))])
		case 5:
			return ints[rng.IntN(len(ints))]
		case 6:
			return rng.NormFloat64() * 1e6
		case 7:
			return int32(rng.Int32())
		case 8:
			return uint64(rng.Uint64())
		case 9:
			return []string{str(), str()}
		case 10:
			return time.Unix(rng.Int64N(1<<40), rng.Int64N(1e9)).UTC()
		case 11:
			return Code(str())
		case 12:
			if depth < 3 {
				return randomMap(rng, str, value, depth+1)
			}
			return map[string]any{}
		}
		return struct {
			A string `json:"a,omitempty"`
			B int    `json:"b"`
		}{A: str(), B: rng.IntN(300)}
	}
	for i := range 3000 {
		m := randomMap(rng, str, value, 0)
		if i%50 == 0 {
			m = nil
		}
		f := Fields{b: []byte{}}
		f.value(m)
		if f.err != nil {
			t.Fatal(f.err)
		}
		want, err := Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(f.b, want) {
			t.Fatalf("map %d (%d keys) %v:\n got % x\nwant % x", i, len(m), m, f.b, want)
		}
		// And as a record's field, as an event's data is written.
		var rec Fields
		rec.Value("data", m, len(m) == 0)
		var got bytes.Buffer
		if err := rec.Encode(msgpack.NewEncoder(&got)); err != nil {
			t.Fatal(err)
		}
		wantRec, err := Marshal(struct {
			Data map[string]any `json:"data,omitempty"`
		}{m})
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Bytes(), wantRec) {
			t.Fatalf("record of map %d:\n got % x\nwant % x", i, got.Bytes(), wantRec)
		}
	}
}

// randomMap is a map of up to 20 keys (some more than are sorted in place),
// with values of value.
func randomMap(rng *rand.Rand, str func() string, value func(int) any, depth int) map[string]any {
	m := map[string]any{}
	for range rng.IntN(21) {
		m[str()] = value(depth)
	}
	return m
}
