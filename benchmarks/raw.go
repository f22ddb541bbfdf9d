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
	js, stop, err := startJetStream("raw-jetstream-")
	if err != nil {
		return nil, err
	}
	defer stop()
	pjs := js.pjs
	stream, err := pjs.CreateStream(ctx, jetstream.StreamConfig{Name: "TASKS", Subjects: []string{"tasks.>"},
		Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage})
	if err != nil {
		return nil, err
	}
	if _, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "workers",
		AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 10 * wl.concurrency}); err != nil {
		return nil, err
	}
	cons, err := js.wjs.Consumer(ctx, "TASKS", "workers")
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

// jetStream is an embedded server's connections for the producers and the
// workers, each with its JetStream context.
type jetStream struct {
	pjs, wjs jetstream.JetStream
	pnc, wnc *nats.Conn
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
