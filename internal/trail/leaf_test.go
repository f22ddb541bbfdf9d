package trail

import (
	"testing"

	"github.com/nats-io/nats.go"
	"golang.org/x/mod/sumdb/tlog"
)

// LeafHash hashes the leaf LeafData frames, whatever the headers, and two
// messages that differ in anything a reader reads have different leaves.
func TestLeafHash_IsTheRecordHashOfTheLeaf(t *testing.T) {
	msgs := []struct {
		subject string
		h       nats.Header
		data    []byte
	}{
		{"capstan.audit.1f3", nil, []byte("data")},
		{"capstan.audit.1f3", nats.Header{}, []byte("data")},
		{"capstan.audit.1f3", nats.Header{"Capstan-Execution": {"alice.1"}}, []byte("data")},
		{"capstan.audit.1f3", nats.Header{"Capstan-Execution": {"alice.1"}, "B": {"2", "1"}, "A": {"x"}}, []byte("data")},
		{"capstan.audit.1f3", nats.Header{"Capstan-Execution": {"bob.1"}}, []byte("data")},
		{"capstan.audit.1f4", nats.Header{"Capstan-Execution": {"alice.1"}}, []byte("data")},
		{"capstan.audit.1f3", nats.Header{"Capstan-Execution": {"alice.1"}}, []byte("datA")},
		{"", nil, []byte("12")},
	}
	seen := map[tlog.Hash]int{}
	for i, m := range msgs {
		h := LeafHash(m.subject, m.h, m.data)
		if want := tlog.RecordHash(LeafData(m.subject, m.h, m.data)); h != want {
			t.Fatalf("message %d: LeafHash is not the record hash of its leaf", i)
		}
		if j, ok := seen[h]; ok && !(i == 1 && j == 0) { // no header and an empty one are the same stored message
			t.Fatalf("messages %d and %d share a leaf", j, i)
		}
		seen[h] = i
	}
	if GapLeaf(12) == nil || tlog.RecordHash(GapLeaf(12)) != LeafHash("", nil, []byte("12")) {
		t.Fatal("the gap leaf is not an empty subject with the sequence as its data")
	}
}
