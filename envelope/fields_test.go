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
