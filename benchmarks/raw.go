package main

import (
	"context"
	"time"

	"github.com/google/uuid"
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
	js, stop, err := startJetStream("raw-jetstream-")
	if err != nil {
		return nil, err
	}
	defer stop()
	t := newTracker(wl.n)
	tasks := []jetstream.StreamConfig{{Name: "TASKS", Subjects: []string{"tasks.>"}}}
	cpu, err := js.measure(ctx, wl, t, tasks, "tasks.noop", func(m jetstream.Msg) {
		_ = m.Ack()
		if d := m.Data(); len(d) >= idLen {
			t.finish(string(d[:idLen]))
		}
	})
	if err != nil {
		return nil, err
	}
	return t.result("JetStream work queue", embeddedJetStream, cpu), nil
}

// idLen is the length of a task's id, which leads its message's data on
// JetStream alone.
const idLen = 36

// jetStream is an embedded server's connections for the producers and the
// workers, each with its JetStream context.
type jetStream struct {
	pjs, wjs jetstream.JetStream
	pnc, wnc *nats.Conn
}

// measure runs the workload on JetStream alone (see tracker.measure): it
// creates streams on the file store, the first a work queue, hands its
// deliveries to handle from the workers' pull consumer, and publishes each
// task to subject, acknowledged, as its id and wl's payload.
func (js *jetStream) measure(ctx context.Context, wl workload, t *tracker, streams []jetstream.StreamConfig, subject string, handle jetstream.MessageHandler) (float64, error) {
	for i, sc := range streams {
		if i == 0 {
			sc.Retention = jetstream.WorkQueuePolicy
		}
		sc.Storage = jetstream.FileStorage
		if _, err := js.pjs.CreateStream(ctx, sc); err != nil {
			return 0, err
		}
	}
	queue, err := js.pjs.Stream(ctx, streams[0].Name)
	if err != nil {
		return 0, err
	}
	if _, err := queue.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "workers",
		AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 10 * wl.concurrency}); err != nil {
		return 0, err
	}
	cons, err := js.wjs.Consumer(ctx, streams[0].Name, "workers")
	if err != nil {
		return 0, err
	}
	cc, err := cons.Consume(handle, jetstream.PullMaxMessages(2*wl.concurrency))
	if err != nil {
		return 0, err
	}
	defer cc.Stop()
	return t.measure(ctx, wl, uuid.NewString, func(ctx context.Context, id string) error {
		_, err := js.pjs.Publish(ctx, subject, append([]byte(id), wl.payload...))
		return err
	})
}

// startJetStream starts an embedded JetStream server (its store in a
// temporary directory whose name begins with dirPrefix) and connects the
// producers and the workers; stop closes both and stops the server.
func startJetStream(dirPrefix string) (*jetStream, func(), error) {
	url, stopServer, err := startServer(dirPrefix)
	if err != nil {
		return nil, nil, err
	}
	js := &jetStream{}
	stop := func() {
		for _, nc := range []*nats.Conn{js.pnc, js.wnc} {
			if nc != nil {
				nc.Close()
			}
		}
		stopServer()
	}
	if js.pnc, err = nats.Connect(url); err == nil {
		js.wnc, err = nats.Connect(url)
	}
	if err == nil {
		js.pjs, err = jetstream.New(js.pnc)
	}
	if err == nil {
		js.wjs, err = jetstream.New(js.wnc)
	}
	if err != nil {
		stop()
		return nil, nil, err
	}
	return js, stop, nil
}

// settle lets what a system left running (acknowledgements, timers) end
// before the next one is measured.
func settle() { time.Sleep(200 * time.Millisecond) }
