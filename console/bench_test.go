package console_test

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/capstan-dev/capstan/console"
	"github.com/capstan-dev/capstan/executor"
)

// BenchmarkExecutionsPage renders /executions over a day holding 1000
// executions (about 4000 audit events, each read on every render).
func BenchmarkExecutionsPage(b *testing.B) {
	benchPage(b, "/executions", 1000)
}

// BenchmarkInbox renders /approvals with 100 pending approvals.
func BenchmarkInbox(b *testing.B) {
	benchPage(b, "/approvals", 100)
}

func benchPage(b *testing.B, path string, n int) {
	r := startRig(b, "", console.Config{Open: true})
	reqs := make([]executor.Request, n)
	for i := range reqs {
		capID, input := "demo.echo", any(map[string]any{"i": i})
		if path == "/approvals" {
			capID, input = "orders.refund", refund(int64(600+i))
		}
		reqs[i] = executor.Request{CapabilityID: capID, Input: input, Options: []executor.CallOption{executor.As(alice)}}
	}
	_, errs := r.client.CallMany(b.Context(), reqs)
	for _, err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
	w := signInOpen(b, r.base, "user:bob", "").c
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		resp, err := w.Get(r.base + path)
		if err != nil {
			b.Fatal(err)
		}
		if resp.StatusCode != http.StatusOK {
			b.Fatal(fmt.Sprint(resp.StatusCode))
		}
		resp.Body.Close()
	}
}
