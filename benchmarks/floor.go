package main

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// runFloor runs the workload on JetStream alone doing the server's part of
// one capstan execution and nothing of capstan's own: the producers'
// acknowledged publishes to a work queue; wl.concurrency workers, each
// taking a delivery, writing its record create-only (not for a read, which
// runs without a claim), writing its result create-only, republished to the
// producers' subscriber, publishing one unacknowledged trail message and
// acknowledging the delivery. A task is done when its result reaches the
// subscriber, as a capstan task is when its envelope does. Its throughput
// is what capstan could reach on this machine if its own work (decoding,
// checks, encoding, the trail's batching) cost nothing.
func runFloor(ctx context.Context, wl workload, read bool) (*result, error) {
	js, stop, err := startJetStream("floor-jetstream-")
	if err != nil {
		return nil, err
	}
	defer stop()
	pnc, wnc, wjs := js.pnc, js.wnc, js.wjs
	t := newTracker(wl.n)
	sub, err := pnc.Subscribe("floor.done.>", func(m *nats.Msg) {
		t.finish(strings.TrimPrefix(m.Subject, "floor.done."))
	})
	if err != nil {
		return nil, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	_ = sub.SetPendingLimits(-1, -1)

	// The workers: wl.concurrency of them, each working one delivery at a
	// time.
	var workErr atomic.Value
	createOnly := func(subject string, data []byte) error {
		_, err := wjs.PublishMsg(ctx, &nats.Msg{Subject: subject, Data: data,
			Header: nats.Header{jetstream.ExpectedLastSubjSeqHeader: []string{"0"}}})
		return err
	}
	deliveries, quit := make(chan jetstream.Msg, wl.concurrency), make(chan struct{})
	var workers sync.WaitGroup
	for range wl.concurrency {
		workers.Add(1)
		go func() {
			defer workers.Done()
			for {
				var m jetstream.Msg
				select {
				case m = <-deliveries:
				case <-quit:
					return
				}
				d := m.Data()
				id := string(d[:idLen])
				var err error
				if !read {
					err = createOnly("floor.rec."+id, d)
				}
				if err == nil {
					err = createOnly("floor.res."+id, d)
				}
				if err == nil {
					err = wnc.Publish("floor.trail."+id, d)
				}
				if err != nil {
					workErr.CompareAndSwap(nil, err)
				}
				_ = m.Ack()
			}
		}()
	}
	defer func() { close(quit); workers.Wait() }()
	streams := []jetstream.StreamConfig{
		{Name: "REQ", Subjects: []string{"floor.req"}},
		{Name: "REC", Subjects: []string{"floor.rec.>"}},
		{Name: "RES", Subjects: []string{"floor.res.>"},
			RePublish: &jetstream.RePublish{Source: "floor.res.>", Destination: "floor.done.>"}},
		{Name: "TRAIL", Subjects: []string{"floor.trail.>"}},
	}
	cpu, err := js.measure(ctx, wl, t, streams, "floor.req", func(m jetstream.Msg) {
		select {
		case deliveries <- m:
		case <-quit:
		}
	})
	if err != nil {
		return nil, err
	}
	if err, _ := workErr.Load().(error); err != nil {
		return nil, err
	}
	system := "JetStream alone, a capstan execution's server work"
	if read {
		system = "JetStream alone, a read without claims' server work"
	}
	return t.result(system, embeddedJetStream, cpu), nil
}
