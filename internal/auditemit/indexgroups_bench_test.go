package auditemit

import (
	"strconv"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/internal/broker"
)

// BenchmarkIndexEntry is what the index costs a quick execution on its
// worker: the entry made from its one trail message, encoded, and filed in
// its subject's group (the group's message, sent once per 1,024 entries or
// 250 ms, is not sent here).
func BenchmarkIndexEntry(b *testing.B) {
	gs := newIndexGroups(broker.NewNames(""), func(g *indexGroup) { g.release() })
	gs.linger = time.Hour
	now := time.Now()
	evs := func(id string) []*audit.Event {
		mk := func(typ string, data map[string]any) *audit.Event {
			return &audit.Event{Type: typ, ExecutionID: id, CapabilityID: "demo.echo", Principal: "_anon",
				Actor: audit.Actor{ID: "capstan-bench", Kind: "service"}, Surface: "direct", Timestamp: now, Data: data}
		}
		return []*audit.Event{mk(audit.EventRequested, nil), mk(audit.EventStarted, map[string]any{"attempt": 1}),
			mk(audit.EventCompleted, map[string]any{"attempts": 1, "durationMs": int64(2)})}
	}
	msgs := make([][]*audit.Event, 1024)
	for i := range msgs {
		msgs[i] = evs("01a24a7f-1180-7455-b0cb-" + strconv.Itoa(100000000000+i))
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		entry := entryOf(msgs[i%len(msgs)])
		if err := gs.add(entry); err != nil {
			b.Fatal(err)
		}
	}
}
