package bench

import (
	"context"
	"strings"
	"time"

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

	loop := newStampedLoop(cfg, bar)
	consumeCtx, err := cons.Consume(func(m jetstream.Msg) {
		_ = m.Ack()
		loop.arrived(m.Data())
	}, jetstream.PullMaxMessages(max(cfg.Workers, 1)*max(cfg.WorkerConcurrency, 1)))
	if err != nil {
		return nil, err
	}
	defer consumeCtx.Stop()
	return loop.run(ctx, func(slot int) error {
		_, err := js.Publish(ctx, subject, loop.message(slot, payload))
		return err
	})
}
