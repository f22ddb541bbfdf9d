package audit

import (
	"bytes"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

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

// An index entry's own encoder writes what the reflective encoder writes,
// and a reader decodes it back.
func TestEntryEncoder_WritesTheReflectiveEncodersBytes(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 1, 10, 0, 0, 123456789, time.UTC)
	full := Entry{V: 1, ExecutionID: "x-1", Principal: "app", CapabilityID: "demo.echo",
		Actor: Actor{ID: "alice", Kind: "user"}, Surface: "mcp", Status: EntryFailed, Code: "TIMEOUT",
		Attempts: 3, DurationMs: 1500, ApprovalID: "ap-1", Resumed: true, RequestedAt: at, UpdatedAt: at.Add(time.Second)}
	// plainEntry has Entry's fields without its encoder: the reflective
	// encoder writes it.
	type plainEntry Entry
	for _, e := range []Entry{full, {V: 1, ExecutionID: "x-2", Status: EntryCompleted, UpdatedAt: at}} {
		own, err := envelope.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		enc := msgpack.NewEncoder(&buf)
		enc.SetCustomStructTag("json")
		enc.SetOmitEmpty(true)
		enc.UseCompactInts(true)
		enc.SetSortMapKeys(true)
		if err := enc.Encode(plainEntry(e)); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(own, buf.Bytes()) {
			t.Fatalf("entry %s: own encoding\n%x\nreflective\n%x", e.ExecutionID, own, buf.Bytes())
		}
		back, err := decodeEntries(own)
		if err != nil || len(back) != 1 || back[0].ExecutionID != e.ExecutionID || !back[0].UpdatedAt.Equal(e.UpdatedAt) {
			t.Fatalf("decoded %+v %v", back, err)
		}
	}

}
