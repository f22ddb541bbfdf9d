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
	cons, err := js.workQueue(ctx, wl, jetstream.StreamConfig{Name: "TASKS", Subjects: []string{"tasks.>"}})
	if err != nil {
		return nil, err
	}

	t := newTracker(wl.n)
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

	cpu, err := t.measure(ctx, wl, uuid.NewString, js.publishTask("tasks.noop", wl))
	if err != nil {
		return nil, err
	}
	return t.result("JetStream work queue", embeddedJetStream, cpu), nil
}

// idLen is the length of a task's id, which leads its message's data on
// JetStream alone.
const idLen = 36

// publishTask is the producers' enqueue on JetStream alone: an
// acknowledged publish to subject of the task's id and wl's payload.
func (js *jetStream) publishTask(subject string, wl workload) func(ctx context.Context, id string) error {
	return func(ctx context.Context, id string) error {
		_, err := js.pjs.Publish(ctx, subject, append([]byte(id), wl.payload...))
		return err
	}
}

// jetStream is an embedded server's connections for the producers and the
// workers, each with its JetStream context.
type jetStream struct {
	pjs, wjs jetstream.JetStream
	pnc, wnc *nats.Conn
}

// workQueue creates streams on the file store, the first a work queue, and
// the workers' consumer of it, which they pull from with as many
// acknowledgements pending as every run on JetStream alone allows.
func (js *jetStream) workQueue(ctx context.Context, wl workload, streams ...jetstream.StreamConfig) (jetstream.Consumer, error) {
	for i, sc := range streams {
		if i == 0 {
			sc.Retention = jetstream.WorkQueuePolicy
		}
		sc.Storage = jetstream.FileStorage
		if _, err := js.pjs.CreateStream(ctx, sc); err != nil {
			return nil, err
		}
	}
	queue, err := js.pjs.Stream(ctx, streams[0].Name)
	if err != nil {
		return nil, err
	}
	if _, err := queue.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "workers",
		AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 10 * wl.concurrency}); err != nil {
		return nil, err
	}
	return js.wjs.Consumer(ctx, streams[0].Name, "workers")
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
