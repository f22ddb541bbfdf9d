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
	loop := newStampedLoop(cfg, bar)
	queue := []jetstream.StreamConfig{{Name: name, Subjects: []string{subject}}}
	stop, err := workQueue(ctx, js, cfg, "raw", queue, func(m jetstream.Msg) {
		_ = m.Ack()
		loop.arrived(m.Data())
	})
	if err != nil {
		return nil, err
	}
	defer stop()
	return loop.run(ctx, func(slot int) error {
		_, err := js.Publish(ctx, subject, loop.message(slot, payload))
		return err
	})
}

// workQueue creates streams on the file store for a run on JetStream alone,
// the first a work queue, and consumes it as durable, through handle, with
// as many messages pending and pulled at once as capstan's workers have;
// stop ends the consumer and deletes the streams.
func workQueue(ctx context.Context, js jetstream.JetStream, cfg *Config, durable string, streams []jetstream.StreamConfig, handle jetstream.MessageHandler) (stop func(), err error) {
	remove := func() {
		dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, sc := range streams {
			_ = js.DeleteStream(dctx, sc.Name)
		}
	}
	for i, sc := range streams {
		if i == 0 {
			sc.Retention = jetstream.WorkQueuePolicy
		}
		sc.Storage = jetstream.FileStorage
		if _, err := js.CreateOrUpdateStream(ctx, sc); err != nil {
			remove()
			return nil, err
		}
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, streams[0].Name, jetstream.ConsumerConfig{
		Durable: durable, AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: max(4*cfg.Concurrency, 1000),
	})
	var consumeCtx jetstream.ConsumeContext
	if err == nil {
		consumeCtx, err = cons.Consume(handle, jetstream.PullMaxMessages(max(cfg.Workers, 1)*max(cfg.WorkerConcurrency, 1)))
	}
	if err != nil {
		remove()
		return nil, err
	}
	return func() { consumeCtx.Stop(); remove() }, nil
}
