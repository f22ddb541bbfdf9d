package main

import (
	"context"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// runRaw runs the workload on JetStream alone, as a bare work queue: a
// work-queue stream on an embedded server's file store, the producers'
// publishes each acknowledged by the stream, one pull consumer whose
// messages are acknowledged as they are worked. It is what capstan's
// execution rests on, without anything of capstan: a task is done when its
// worker has acknowledged it.
func runRaw(ctx context.Context, wl workload) (*result, error) {
	url, stop, err := startServer("raw-jetstream-")
	if err != nil {
		return nil, err
	}
	defer stop()

	pnc, err := nats.Connect(url)
	if err != nil {
		return nil, err
	}
	defer pnc.Close()
	wnc, err := nats.Connect(url)
	if err != nil {
		return nil, err
	}
	defer wnc.Close()
	pjs, err := jetstream.New(pnc)
	if err != nil {
		return nil, err
	}
	stream, err := pjs.CreateStream(ctx, jetstream.StreamConfig{Name: "TASKS", Subjects: []string{"tasks.>"},
		Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage})
	if err != nil {
		return nil, err
	}
	if _, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "workers",
		AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 10 * wl.concurrency}); err != nil {
		return nil, err
	}
	wjs, err := jetstream.New(wnc)
	if err != nil {
		return nil, err
	}
	cons, err := wjs.Consumer(ctx, "TASKS", "workers")
	if err != nil {
		return nil, err
	}

	t := newTracker(wl.n)
	const idLen = 36 // a task's id leads its payload
	cc, err := cons.Consume(func(m jetstream.Msg) {
		_ = m.Ack()
		if d := m.Data(); len(d) >= idLen {
			t.finish(string(d[:idLen]))
		}
	}, jetstream.PullMaxMessages(2*wl.concurrency))
	if err != nil {
		return nil, err
	}
	defer cc.Stop()

	cpu := meterCPU()
	err = produce(ctx, wl, uuid.NewString, func(ctx context.Context, id string) error {
		t.start(id)
		_, err := pjs.Publish(ctx, "tasks.noop", append([]byte(id), wl.payload...))
		return err
	})
	if err != nil {
		return nil, err
	}
	if err := t.wait(ctx); err != nil {
		return nil, err
	}
	r := t.result("JetStream work queue", "NATS JetStream "+server.VERSION+" (embedded, file store)")
	r.CPUPerTaskUs = cpu.perTask(wl.n)
	return r, nil
}

// settle lets what a system left running (acknowledgements, timers) end
// before the next one is measured.
func settle() { time.Sleep(200 * time.Millisecond) }
