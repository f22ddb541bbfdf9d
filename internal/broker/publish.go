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

// AsyncAckTimeout is how long an asynchronous publish on a Broker's JetStream
// context waits for its acknowledgement. One the stream never sends (its
// leader was lost, the reply with it) then fails with
// jetstream.ErrAsyncPublishTimeout and leaves the pending publishes, which
// would otherwise fill up and stall every later one.
const AsyncAckTimeout = 10 * time.Second

// Ack is JetStream's acknowledgement of a publish.
type Ack struct {
	Seq uint64 // the stream sequence of the message
	// Duplicate: the stream had the message's Nats-Msg-Id already, within its
	// duplicate window, and stored nothing.
	Duplicate bool
}

// PublishAck publishes m to a stream and waits for JetStream's
// acknowledgement, as jetstream's PublishMsg does with its defaults (no
// responders is tried again twice, 250 ms apart). Three are written per
// execution: the common answer ({"stream": …, "seq": N}) is read without a
// JSON decoder. A refusal is a *jetstream.APIError, as from PublishMsg; a
// full queue's is also a *QueueFullError (ErrQueueFull).
func PublishAck(ctx context.Context, nc *nats.Conn, m *nats.Msg) (Ack, error) {
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
		return Ack{}, jetstream.ErrNoStreamResponse
	}
	if err != nil {
		return Ack{}, err
	}
	return readPubAck(resp.Data)
}

var (
	ackPrefix    = []byte(`{"stream":`)
	ackSeq       = []byte(`"seq":`)
	ackError     = []byte(`"error"`)
	ackDuplicate = []byte(`"duplicate"`)
)

// readPubAck reads a publish acknowledgement, or the error JetStream
// answered.
func readPubAck(b []byte) (Ack, error) {
	if bytes.HasPrefix(b, ackPrefix) && !bytes.Contains(b, ackError) && !bytes.Contains(b, ackDuplicate) {
		if i := bytes.Index(b, ackSeq); i > 0 {
			d := bytes.TrimLeft(b[i+len(ackSeq):], " ")
			n := 0
			for n < len(d) && '0' <= d[n] && d[n] <= '9' {
				n++
			}
			if seq, err := strconv.ParseUint(string(d[:n]), 10, 64); err == nil {
				return Ack{Seq: seq}, nil
			}
		}
	}
	var r struct {
		Error     *jetstream.APIError `json:"error"`
		Stream    string              `json:"stream"`
		Seq       uint64              `json:"seq"`
		Duplicate bool                `json:"duplicate"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return Ack{}, jetstream.ErrInvalidJSAck
	}
	if r.Error != nil {
		err := fmt.Errorf("nats: %w", r.Error)
		if qf := AsQueueFull(err); qf != nil {
			return Ack{}, qf
		}
		return Ack{}, err
	}
	if r.Stream == "" {
		return Ack{}, jetstream.ErrInvalidJSAck
	}
	return Ack{Seq: r.Seq, Duplicate: r.Duplicate}, nil
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
	m := &nats.Msg{Subject: "$KV." + kv.Bucket() + "." + key, Header: h, Data: b}
	ack, err := PublishAck(ctx, nc, m)
	if err == nil || !WrongLastSequence(err) {
		return ack.Seq, err
	}
	// The key has a message: a value, or a delete or purge marker to create
	// over, expecting the marker's sequence. It is read from the stream's
	// leader: a replica's direct get (as jetstream's KeyValue.Create reads)
	// may still answer with the value the marker replaced, and the create be
	// refused for a key that has none.
	seq, deleted, _, lerr := lastFromLeader(ctx, nc, kv.Bucket(), key)
	switch {
	case errors.Is(lerr, ErrNotFound):
		seq = 0 // gone meanwhile (a TTL): as new
	case lerr != nil:
		return 0, lerr
	case !deleted:
		return 0, err // a value: the key exists
	}
	h[jetstream.ExpectedLastSubjSeqHeader] = []string{strconv.FormatUint(seq, 10)}
	ack, err = PublishAck(ctx, nc, m)
	return ack.Seq, err
}

// Create is the package's Create (CreateTTL when ttl > 0) on b's connection,
// in one publish when the key is new: the writes of every execution (its
// claim, its envelope) take this way.
func (b *Broker) Create(ctx context.Context, kv jetstream.KeyValue, key string, v any, ttl time.Duration) (uint64, error) {
	enc, err := envelope.Encode(v)
	if err != nil {
		return 0, err
	}
	defer enc.Release() // a publish has copied the bytes when it returns
	rev, err := create(ctx, b.NC, kv, key, enc.Bytes(), ttl)
	return rev, createErr(err)
}
