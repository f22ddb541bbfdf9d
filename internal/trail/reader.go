package trail

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
)

// reader reads a stream in order from a sequence, in batches of what is
// stored (a no-wait pull: the server sends a batch in a few writes), with an
// ephemeral consumer that acknowledges nothing. A delivery lost on the way
// (a gap in the consumer's sequence) makes it start again after the last
// message it handed out, so that it never skips one. Unlike jetstream's
// ordered consumer it never retries for ever: a failure is its caller's,
// who may give up (a closed connection, a cancelled context).
type reader struct {
	s    jetstream.Stream
	next uint64 // the stream sequence it reads from
	cons jetstream.Consumer
	cseq uint64 // the consumer sequence of the last delivery
}

// ConsumerPrefix begins the name of the consumer a checkpointer or a
// verifier reads the audit stream with: one per reader, gone a minute after
// its last read.
const ConsumerPrefix = "capstan-trail-"

func newReader(s jetstream.Stream, from uint64) *reader { return &reader{s: s, next: max(from, 1)} }

// fetch returns up to n messages from where it is, in order; none when
// none is stored after it.
func (r *reader) fetch(ctx context.Context, n int) ([]*Msg, error) {
	if r.cons == nil {
		c, err := r.s.CreateConsumer(ctx, jetstream.ConsumerConfig{
			Name:          ConsumerPrefix + nuid.Next(),
			DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: r.next,
			AckPolicy: jetstream.AckNonePolicy, InactiveThreshold: time.Minute,
			MemoryStorage: true, Replicas: 1,
		})
		if err != nil {
			return nil, err
		}
		r.cons, r.cseq = c, 0
	}
	batch, err := r.cons.FetchNoWait(n)
	if err != nil {
		r.close()
		return nil, err
	}
	var out []*Msg
	for m := range batch.Messages() {
		md, err := m.Metadata()
		if err != nil || md.Sequence.Consumer != r.cseq+1 {
			// Lost on the way: read again from the first not handed out.
			for range batch.Messages() {
			}
			r.close()
			return out, nil
		}
		r.cseq, r.next = md.Sequence.Consumer, md.Sequence.Stream+1
		out = append(out, &Msg{Seq: md.Sequence.Stream, Subject: m.Subject(), Header: m.Headers(), Data: m.Data(), Time: md.Timestamp})
	}
	if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, jetstream.ErrNoMessages) {
		r.close()
		return out, err
	}
	return out, nil
}

// close deletes the consumer (it would go after a minute unused anyway).
func (r *reader) close() {
	if r.cons == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = r.s.DeleteConsumer(ctx, r.cons.CachedInfo().Name)
	r.cons = nil
}
