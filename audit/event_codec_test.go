package audit

import (
	"bytes"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/codectest"
)

// plainEvent is Event without its EncodeMsgpack method.
type plainEvent Event

func TestEventEncoder_WritesTheReflectiveEncodersBytes(t *testing.T) {
	t.Parallel()
	var filled Event
	codectest.Fill(&filled)
	for name, e := range map[string]Event{
		"every field": filled,
		"zero":        {},
		"full": {V: envelope.Version, Type: EventCompleted, Timestamp: time.Now().UTC(), Surface: "mcp", Actor: Actor{ID: "alice", Kind: "user"},
			ExecutionID: envelope.NewExecutionID(), CapabilityID: "demo.echo", CorrelationID: "c1", InputHash: "ab12", Worker: "w1",
			Data: map[string]any{"attempts": 2}},
		"actor kind only": {Type: EventStarted, Actor: Actor{Kind: "anonymous"}, Data: map[string]any{}},
	} {
		got, err := envelope.Marshal(&e)
		if err != nil {
			t.Fatal(err)
		}
		want, err := envelope.Marshal((*plainEvent)(&e))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s:\n got % x\nwant % x", name, got, want)
		}
	}
}
