package policies

import (
	"testing"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/procstat"
)

// What deciding one call costs with the ten-rule set of TestDecide_TenRules:
// the entities, the input made a Cedar value, the evaluation. The worker's
// whole cost per execution is measured with capstan bench (docs/performance.md).
func BenchmarkDecide_TenRules(b *testing.B) {
	s, err := Compile("bench.cedar", []byte(tenRules))
	if err != nil {
		b.Fatal(err)
	}
	type input struct {
		To      string   `json:"to"`
		Subject string   `json:"subject"`
		Cc      []string `json:"cc,omitempty"`
		HoldMs  int      `json:"holdMs,omitempty"`
	}
	c := emailSend
	req := Request{Principal: "acme", Actor: envelope.Actor{Kind: "agent", ID: "bot", Attrs: map[string]string{"team": "ops"}},
		Capability: &c, Surface: "mcp", Input: &input{To: "a@example.com", Subject: "hello", Cc: []string{"b@example.com"}}}
	b.ReportAllocs()
	cpu := procstat.CPU()
	for b.Loop() {
		if d := s.Decide(req); !d.Allow {
			b.Fatal(d)
		}
	}
	// The process's CPU time per decision (the collector's included):
	// steadier than the wall clock on a shared machine.
	b.ReportMetric(float64(procstat.CPU()-cpu)/float64(b.N), "cpu-ns/op")
}
