package sweeper

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// sweepRig is a sweeper on a real embedded JetStream holding queued
// requests that no consumer takes.
func sweepRig(b *testing.B, queued int, startBy time.Time) *Sweeper {
	b.Helper()
	br, eng := rig(b)
	w := New(br, eng, Config{Worker: "sweeper"})
	subject := br.Names.ExecSubject(broker.Anonymous, "bench.nowhere")
	var futures []jetstream.PubAckFuture
	for i := range queued {
		req := &envelope.Request{V: envelope.Version, ExecutionID: "sweep-" + strconv.Itoa(i), CapabilityID: "bench.nowhere",
			Actor: envelope.Actor{Kind: "user", ID: "alice"}, SubmittedAt: time.Now().UTC(), StartBy: &startBy}
		data, err := envelope.Marshal(req)
		if err != nil {
			b.Fatal(err)
		}
		m := nats.NewMsg(subject)
		m.Data = data
		m.Header.Set(jetstream.MsgIDHeader, req.ExecutionID)
		f, err := br.JS.PublishMsgAsync(m)
		if err != nil {
			b.Fatal(err)
		}
		futures = append(futures, f)
		if len(futures) == 1000 {
			for _, f := range futures {
				select {
				case <-f.Ok():
				case err := <-f.Err():
					b.Fatal(err)
				}
			}
			futures = futures[:0]
		}
	}
	for _, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			b.Fatal(err)
		}
	}
	return w
}

// BenchmarkSweep_Walk100kQueued is one sweeper pass over 100,000 queued
// requests none of which is due: the cost the sweeper pays every interval
// when a backlog waits for a pool.
func BenchmarkSweep_Walk100kQueued(b *testing.B) {
	w := sweepRig(b, 100_000, time.Now().Add(time.Hour))
	ctx := context.Background()
	b.ResetTimer()
	for b.Loop() {
		n, err := w.Pass(ctx)
		if err != nil || n != 0 {
			b.Fatalf("swept %d: %v", n, err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/100_000, "ns/request")
}

// BenchmarkSweep_End10kDue is one pass ending 10,000 requests past their
// start deadline NOT_STARTED: record, trail, envelope and removal each.
func BenchmarkSweep_End10kDue(b *testing.B) {
	for b.Loop() {
		b.StopTimer()
		w := sweepRig(b, 10_000, time.Now().Add(-time.Second))
		b.StartTimer()
		n, err := w.Pass(context.Background())
		if err != nil || n != 10_000 {
			b.Fatalf("swept %d: %v", n, err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/10_000, "ns/request")
}
