package broker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/capstan-dev/capstan/internal/msgenc"
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
	return publishAck(bound{ctx: ctx}, nc, m)
}

// bound is how long a publish may wait for its acknowledgement: until ctx
// ends, or, ctx nil, until deadline alone, which the connection's own
// pooled timer keeps (no context made and ended for each write).
type bound struct {
	ctx      context.Context
	deadline time.Time
}

// within is a bound of timeout from now.
func within(timeout time.Duration) bound { return bound{deadline: time.Now().Add(timeout)} }

// request sends m and waits for its answer within the bound.
func (w bound) request(nc *nats.Conn, m *nats.Msg) (*nats.Msg, error) {
	if w.ctx != nil {
		return nc.RequestMsgWithContext(w.ctx, m)
	}
	left := time.Until(w.deadline)
	if left <= 0 {
		return nil, context.DeadlineExceeded
	}
	return nc.RequestMsg(m, left)
}

// pause waits d, or less when the bound ends first.
func (w bound) pause(d time.Duration) {
	if w.ctx != nil {
		select {
		case <-w.ctx.Done():
		case <-time.After(d):
		}
		return
	}
	time.Sleep(max(min(d, time.Until(w.deadline)), 0))
}

// context is the bound as a context, for a rare read on the way.
func (w bound) context() (context.Context, context.CancelFunc) {
	if w.ctx != nil {
		return w.ctx, func() {}
	}
	return context.WithDeadline(context.Background(), w.deadline)
}

// publishAck is PublishAck within w: a context without a deadline is given
// one of 5 s.
func publishAck(w bound, nc *nats.Conn, m *nats.Msg) (Ack, error) {
	if w.ctx != nil {
		if _, ok := w.ctx.Deadline(); !ok {
			var cancel context.CancelFunc
			w.ctx, cancel = context.WithTimeout(w.ctx, 5*time.Second)
			defer cancel()
		}
	}
	resp, err := w.request(nc, m)
	for try := 0; errors.Is(err, nats.ErrNoResponders) && try < 2; try++ {
		// A stream electing a leader answers no one for a moment.
		w.pause(250 * time.Millisecond)
		resp, err = w.request(nc, m)
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
func create(w bound, nc *nats.Conn, kv jetstream.KeyValue, key string, b []byte, ttl time.Duration) (uint64, error) {
	m := &nats.Msg{Subject: "$KV." + kv.Bucket() + "." + key, Header: createHeader(ttl), Data: b}
	ack, err := publishAck(w, nc, m)
	if err == nil || !WrongLastSequence(err) {
		return ack.Seq, err
	}
	// The key has a message: a value, or a delete or purge marker to create
	// over, expecting the marker's sequence. It is read from the stream's
	// leader: a replica's direct get (as jetstream's KeyValue.Create reads)
	// may still answer with the value the marker replaced, and the create be
	// refused for a key that has none.
	ctx, cancel := w.context()
	defer cancel()
	seq, deleted, _, lerr := lastFromLeader(ctx, nc, kv.Bucket(), key)
	switch {
	case errors.Is(lerr, ErrNotFound):
		seq = 0 // gone meanwhile (a TTL): as new
	case lerr != nil:
		return 0, lerr
	case !deleted:
		return 0, err // a value: the key exists
	}
	h := nats.Header{jetstream.ExpectedLastSubjSeqHeader: []string{strconv.FormatUint(seq, 10)}}
	if ttl > 0 {
		h[jetstream.MsgTTLHeader] = m.Header[jetstream.MsgTTLHeader]
	}
	m.Header = h // the one createHeader gave is shared: never written
	ack, err = publishAck(w, nc, m)
	return ack.Seq, err
}

// Create is the package's Create (CreateTTL when ttl > 0) on b's connection,
// in one publish when the key is new: the writes of every execution (its
// claim, its envelope) take this way.
func (b *Broker) Create(ctx context.Context, kv jetstream.KeyValue, key string, v any, ttl time.Duration) (uint64, error) {
	return b.create(bound{ctx: ctx}, kv, key, v, ttl)
}

// CreateWithin is Create bounded by timeout alone, for a write no caller
// cancels (a worker's claim and envelope): the wait for its acknowledgement
// is timed by the connection, with no context made for it.
func (b *Broker) CreateWithin(timeout time.Duration, kv jetstream.KeyValue, key string, v any, ttl time.Duration) (uint64, error) {
	return b.create(within(timeout), kv, key, v, ttl)
}

func (b *Broker) create(w bound, kv jetstream.KeyValue, key string, v any, ttl time.Duration) (uint64, error) {
	enc, err := msgenc.Encode(v)
	if err != nil {
		return 0, err
	}
	defer enc.Release() // a publish has copied the bytes when it returns
	rev, err := create(w, b.NC, kv, key, enc.Bytes(), ttl)
	return rev, createErr(err)
}

// newKeyHeader is the header of a create without a TTL: it expects no
// message on the key's subject. Shared by every such create, it is only
// read (a publish writes a message's header out, and changes nothing).
var newKeyHeader = nats.Header{jetstream.ExpectedLastSubjSeqHeader: []string{"0"}}

// lastTTL is the header of a create with the last TTL written: the records
// of a deployment carry one (the record window) nearly always.
var lastTTL atomic.Pointer[ttlHeader]

type ttlHeader struct {
	ttl    time.Duration
	header nats.Header // read only, as newKeyHeader
}

// createHeader is the header of a create with ttl (none: 0), made once for
// the TTL most writes carry. It is shared: never written.
func createHeader(ttl time.Duration) nats.Header {
	if ttl <= 0 {
		return newKeyHeader
	}
	if last := lastTTL.Load(); last != nil && last.ttl == ttl {
		return last.header
	}
	t := &ttlHeader{ttl: ttl, header: nats.Header{
		jetstream.ExpectedLastSubjSeqHeader: []string{"0"},
		jetstream.MsgTTLHeader:              []string{ttl.String()},
	}}
	lastTTL.Store(t)
	return t.header
}
