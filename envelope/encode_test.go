package envelope

import (
	"bytes"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/internal/codectest"
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
