package trail

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/procstat"
	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/nats-io/nats.go"
)

// BenchmarkCheckpointer_CatchUp is what the log costs per audit message: a
// checkpointer reads a stream of b.N stored messages of 1.2 KB (a quick
// execution's trail, DESIGN §16) and signs the checkpoints that cover
// them. CPU is the whole process's, the embedded server's delivery of each
// message to the checkpointer included; compare it with the CPU of an
// execution ('capstan bench').
func BenchmarkCheckpointer_CatchUp(b *testing.B) {
	b.Run("checkpoint", func(b *testing.B) { benchCatchUp(b, false) })
	// The baseline: the same messages read by an ordered consumer, and
	// nothing done with them.
	b.Run("read-only", func(b *testing.B) { benchCatchUp(b, true) })
}

func benchCatchUp(b *testing.B, readOnly bool) {
	env := testenv.Start(b)
	nc := env.Connect(b)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	bk, err := broker.Provision(ctx, nc, broker.Config{})
	if err != nil {
		b.Fatal(err)
	}
	data := make([]byte, 1200)
	for i := range data {
		data[i] = byte('a' + i%26)
	}
	for i := range b.N {
		key := fmt.Sprintf("_anon.bench-%08d", i)
		m := &nats.Msg{Subject: bk.Names.AuditSubject(key), Header: nats.Header{broker.AuditExecutionHeader: {key}}, Data: data}
		if _, err := bk.JS.PublishMsgAsync(m); err != nil {
			b.Fatal(err)
		}
		if i%1000 == 999 {
			<-bk.JS.PublishAsyncComplete()
		}
	}
	<-bk.JS.PublishAsyncComplete()
	if readOnly {
		cpu := procstat.CPU()
		b.ResetTimer()
		n := 0
		if err := FromDeployment(bk).Messages(ctx, 1, func(*Msg) error { n++; return nil }); err != nil || n != b.N {
			b.Fatalf("read %d of %d: %v", n, b.N, err)
		}
		b.StopTimer()
		b.ReportMetric(float64((procstat.CPU()-cpu).Microseconds())/float64(b.N), "cpu-µs/event")
		return
	}
	k := newKeyTB(b, "bench.example/log")
	cp := NewCheckpointer(bk, k.signer, k.vkey, k.known, Config{Interval: 100 * time.Millisecond})
	cpu := procstat.CPU()
	b.ResetTimer()
	run, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = cp.Run(run) }()
	for cp.Size() < int64(b.N) {
		time.Sleep(5 * time.Millisecond)
	}
	b.StopTimer()
	used := procstat.CPU() - cpu
	stop()
	<-done
	b.ReportMetric(float64(used.Microseconds())/float64(b.N), "cpu-µs/event")
}
