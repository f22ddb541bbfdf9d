package audit

import (
	"testing"
	"time"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/msgenc"
)

// BenchmarkEncodeExecutionEvents encodes the message a quick execution's
// trail is: its requested, started and completed events, as EmitAll
// encodes them.
func BenchmarkEncodeExecutionEvents(b *testing.B) {
	now := time.Now().UTC()
	base := Event{V: envelope.Version, Timestamp: now, Surface: "direct", Actor: Actor{ID: "bench", Kind: "service"},
		Principal: "anonymous", ExecutionID: envelope.NewExecutionID(), CapabilityID: "demo.echo",
		InputHash: "3f2a9c0d5b7e1f4a6c8d0e2b4a6f8c1d3e5f7a9b0c2d4e6f8a1b3c5d7e9f0a2b", Worker: "w-1"}
	requested, started, completed := base, base, base
	requested.Type = EventRequested
	started.Type, started.Data = EventStarted, map[string]any{"attempt": 1, "approvalId": ""}
	completed.Type, completed.Data = EventCompleted, map[string]any{"attempts": 1, "durationMs": int64(3),
		"envelopeHash": "9b1c3e5f7a9b0c2d4e6f8a1b3c5d7e9f0a2b3f2a9c0d5b7e1f4a6c8d0e2b4a6f"}
	evs := []*Event{&requested, &started, &completed}
	b.ReportAllocs()
	for b.Loop() {
		enc, err := msgenc.Encode(evs)
		if err != nil {
			b.Fatal(err)
		}
		enc.Release()
	}
}
