package bench

import (
	"context"
	"encoding/binary"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// floorLoop runs, on JetStream alone, the server work of one capstan
// execution and nothing of capstan's own: the request's acknowledged
// publish, its delivery, a create-only record write, a create-only result
// write republished to the caller, one unacknowledged trail message and the
// ack: four stored messages, ten server messages, three synchronous writes.
// Its throughput is what capstan's write path could reach if its own work
// (decoding, stages, hashing, encoding, goroutines) cost nothing; its ratio
// to the raw baseline bounds capstan's. Payloads are the request's length; a
// message's latency runs from the publish to the result's arrival.
func floorLoop(ctx context.Context, r *rig, cfg *Config, payload int, bar *progress) (*loopResult, error) {
	js := r.adminJS
	nc := js.Conn()
	prefix := strings.ToLower(r.b.Names.ExecStream()) + "_bench_floor"
	loop := newStampedLoop(cfg, bar)
	results, err := nc.Subscribe(prefix+".done.>", func(m *nats.Msg) { loop.arrived(m.Data) })
	if err != nil {
		return nil, err
	}
	defer func() { _ = results.Unsubscribe() }()

	var workErr atomic.Value
	createOnly := func(subject string, data []byte) error {
		_, err := js.PublishMsg(ctx, &nats.Msg{Subject: subject, Data: data,
			Header: nats.Header{jetstream.ExpectedLastSubjSeqHeader: []string{"0"}}})
		return err
	}
	streams := []jetstream.StreamConfig{
		{Name: r.b.Names.ExecStream() + "_BENCH_FLOOR_REQ", Subjects: []string{prefix + ".req"}},
		{Name: r.b.Names.ExecStream() + "_BENCH_FLOOR_REC", Subjects: []string{prefix + ".rec.>"}},
		{Name: r.b.Names.ExecStream() + "_BENCH_FLOOR_RES", Subjects: []string{prefix + ".res.>"},
			RePublish: &jetstream.RePublish{Source: prefix + ".res.>", Destination: prefix + ".done.>"}},
		{Name: r.b.Names.ExecStream() + "_BENCH_FLOOR_TRAIL", Subjects: []string{prefix + ".trail.>"}},
	}
	stop, err := workQueue(ctx, js, cfg, "floor", streams, func(m jetstream.Msg) {
		go func() {
			d := m.Data()
			id := strconv.FormatUint(binary.BigEndian.Uint64(d[12:20]), 10)
			err := createOnly(prefix+".rec."+id, d)
			if err == nil {
				err = createOnly(prefix+".res."+id, d)
			}
			if err == nil {
				err = nc.Publish(prefix+".trail."+id, d)
			}
			if err != nil {
				workErr.Store(err)
			}
			_ = m.Ack()
		}()
	})
	if err != nil {
		return nil, err
	}
	defer stop()

	var seq atomic.Uint64
	res, err := loop.run(ctx, func(slot int) error {
		b := loop.message(slot, max(payload, 20))
		binary.BigEndian.PutUint64(b[12:20], seq.Add(1))
		_, err := js.Publish(ctx, prefix+".req", b)
		return err
	})
	if err != nil {
		return nil, err
	}
	if err, _ := workErr.Load().(error); err != nil {
		return nil, err
	}
	return res, nil
}
