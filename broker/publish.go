package broker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// PublishAck publishes m to a stream and waits for JetStream's
// acknowledgement, as jetstream's PublishMsg does with its defaults (no
// responders is tried again twice, 250 ms apart), and returns the stream
// sequence. Three are written per execution: the common answer ({"stream":
// …, "seq": N}) is read without a JSON decoder. A refusal is a
// *jetstream.APIError, as from PublishMsg.
func PublishAck(ctx context.Context, nc *nats.Conn, m *nats.Msg) (uint64, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
	}
	resp, err := nc.RequestMsgWithContext(ctx, m)
	for try := 0; errors.Is(err, nats.ErrNoResponders) && try < 2; try++ {
		// A stream electing a leader answers no one for a moment.
		select {
		case <-ctx.Done():
		case <-time.After(250 * time.Millisecond):
		}
		resp, err = nc.RequestMsgWithContext(ctx, m)
	}
	if errors.Is(err, nats.ErrNoResponders) {
		return 0, jetstream.ErrNoStreamResponse
	}
	if err != nil {
		return 0, err
	}
	return readPubAck(resp.Data)
}

var (
	ackPrefix = []byte(`{"stream":`)
	ackSeq    = []byte(`"seq":`)
	ackError  = []byte(`"error"`)
)

// readPubAck returns the sequence of a publish acknowledgement, or the
// error JetStream answered.
func readPubAck(b []byte) (uint64, error) {
	if bytes.HasPrefix(b, ackPrefix) && !bytes.Contains(b, ackError) {
		if i := bytes.Index(b, ackSeq); i > 0 {
			d := bytes.TrimLeft(b[i+len(ackSeq):], " ")
			n := 0
			for n < len(d) && '0' <= d[n] && d[n] <= '9' {
				n++
			}
			if seq, err := strconv.ParseUint(string(d[:n]), 10, 64); err == nil {
				return seq, nil
			}
		}
	}
	var r struct {
		Error  *jetstream.APIError `json:"error"`
		Stream string              `json:"stream"`
		Seq    uint64              `json:"seq"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return 0, jetstream.ErrInvalidJSAck
	}
	if r.Error != nil {
		return 0, fmt.Errorf("nats: %w", r.Error)
	}
	if r.Stream == "" {
		return 0, jetstream.ErrInvalidJSAck
	}
	return r.Seq, nil
}

// create writes b under key of kv only if the key holds no message: one
// publish that expects no earlier message on the key's subject. When the
// key has one (a value, or the marker a delete left), it is kv.Create that
// decides, which writes over a delete marker.
func create(ctx context.Context, nc *nats.Conn, kv jetstream.KeyValue, key string, b []byte, ttl time.Duration) (uint64, error) {
	h := nats.Header{jetstream.ExpectedLastSubjSeqHeader: []string{"0"}}
	if ttl > 0 {
		h[jetstream.MsgTTLHeader] = []string{ttl.String()}
	}
	rev, err := PublishAck(ctx, nc, &nats.Msg{Subject: "$KV." + kv.Bucket() + "." + key, Header: h, Data: b})
	if err == nil || !wrongLastSequence(err) {
		return rev, err
	}
	return kv.Create(ctx, key, b, createOpts(ttl)...)
}

// Create is the package's Create (CreateTTL when ttl > 0) on b's connection,
// in one publish when the key is new: the writes of every execution (its
// claim, its envelope) take this way.
func (b *Broker) Create(ctx context.Context, kv jetstream.KeyValue, key string, v any, ttl time.Duration) (uint64, error) {
	data, err := envelope.Marshal(v)
	if err != nil {
		return 0, err
	}
	rev, err := create(ctx, b.NC, kv, key, data, ttl)
	return rev, createErr(err)
}
