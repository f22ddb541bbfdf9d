package bench

import (
	"context"
	"encoding/binary"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/nats-io/nats.go/jetstream"
)

// rawBaseline runs the same workload on JetStream alone, on the same server:
// publish (acknowledged), pull, ack, with the same payload and the same
// closed-loop concurrency or rate. A message's latency runs from its publish
// to its delivery to the consumer.
func rawBaseline(ctx context.Context, r *rig, cfg *Config, payload int, bar *progress) (*loopResult, error) {
	js := r.adminJS
	name := r.b.Names.ExecStream() + "_BENCH_RAW"
	subject := strings.ToLower(name)
	s, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name: name, Subjects: []string{subject}, Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage,
	})
	if err != nil {
		return nil, err
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = js.DeleteStream(dctx, name)
	}()
	cons, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable: "raw", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: max(4*cfg.Concurrency, 1000),
	})
	if err != nil {
		return nil, err
	}

	// Each message carries its publisher's slot and its publish time; the
	// consumer hands the slot back, closing the loop.
	slots := max(cfg.Concurrency, 1)
	done := make([]chan struct{}, slots)
	for i := range done {
		done[i] = make(chan struct{}, 1)
	}
	t := &tally{notes: cfg.Notes, res: loopResult{latencies: make([]time.Duration, 0, cfg.N)}}
	var got atomic.Int64
	all := make(chan struct{})
	ok := &envelope.Envelope{Status: envelope.StatusCompleted}
	consumeCtx, err := cons.Consume(func(m jetstream.Msg) {
		d := m.Data()
		slot := binary.BigEndian.Uint32(d[0:4])
		sent := time.Unix(0, int64(binary.BigEndian.Uint64(d[4:12])))
		_ = m.Ack()
		t.add(time.Since(sent), ok, nil)
		bar.add(1)
		if cfg.Rate == 0 {
			done[slot] <- struct{}{}
		}
		if got.Add(1) == int64(cfg.N) {
			close(all)
		}
	}, jetstream.PullMaxMessages(max(cfg.Workers, 1)*max(cfg.WorkerConcurrency, 1)))
	if err != nil {
		return nil, err
	}
	defer consumeCtx.Stop()

	publish := func(slot int) error {
		b := make([]byte, max(payload, 12))
		binary.BigEndian.PutUint32(b[0:4], uint32(slot))
		binary.BigEndian.PutUint64(b[4:12], uint64(time.Now().UnixNano()))
		_, err := js.Publish(ctx, subject, b)
		return err
	}
	var pubErr atomic.Value
	start := time.Now()
	switch {
	case cfg.Rate > 0:
		interval := time.Duration(float64(time.Second) / cfg.Rate)
		pace := newPacer(interval)
		for i := 0; i < cfg.N && ctx.Err() == nil; i++ {
			pace.wait(start.Add(time.Duration(i) * interval))
			go func() {
				if err := publish(0); err != nil {
					pubErr.Store(err)
				}
			}()
		}
	default:
		var next atomic.Int64
		var wg sync.WaitGroup
		for slot := range min(slots, cfg.N) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for next.Add(1) <= int64(cfg.N) && ctx.Err() == nil {
					if err := publish(slot); err != nil {
						pubErr.Store(err)
						return
					}
					select {
					case <-done[slot]:
					case <-ctx.Done():
						return
					}
				}
			}()
		}
		wg.Wait()
	}
	if err, _ := pubErr.Load().(error); err != nil {
		return nil, err
	}
	select {
	case <-all:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return t.result(time.Since(start)), nil
}
