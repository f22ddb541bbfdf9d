package audit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/jsget"
	"github.com/nats-io/nats.go"
)

// getRequest is JetStream's message get request (direct or not).
type getRequest = jsget.Request

// stored is one message of the stream as a get returns it.
type stored struct {
	seq    uint64
	time   time.Time
	header nats.Header
	data   []byte
}

const (
	// getBatch and getMaxBytes bound one direct get's answer.
	getBatch    = 256
	getMaxBytes = 1 << 20
	// getTimeout bounds the wait for each answer when ctx has no deadline.
	getTimeout = 10 * time.Second
)

// reader gets the audit stream's messages for one execution's trail: by
// batched direct gets, which every server of a stream's group answers
// without a consumer, or by plain message gets, one message per request,
// when the stream does not allow direct gets (a stream an earlier version
// created, on credentials that could not update it).
type reader struct {
	nc     *nats.Conn
	stream string
	// key (broker.Key) and id of the execution whose trail it reads.
	key, id string
	// direct is false once the stream answered that it has no direct gets.
	direct bool
	inbox  string
	sub    *nats.Subscription
}

func newReader(b *broker.Broker, principal, executionID string) *reader {
	return &reader{nc: b.NC, stream: b.Names.AuditStream(), key: broker.Key(principal, executionID), id: executionID, direct: true}
}

// newStreamReader reads any stream of capstan's (the executions index).
func newStreamReader(nc *nats.Conn, stream string) *reader {
	return &reader{nc: nc, stream: stream, direct: true}
}

func (r *reader) close() {
	if r.sub != nil {
		_ = r.sub.Unsubscribe()
	}
}

// get returns the next messages for req, and whether more may follow them:
// with batch, up to a batch of them, else one.
//
// A batch costs the server a count of the messages pending on the subject
// from the request's start, which for a shard walks every block from there to
// the end of the stream (a shard is in every block): cheap from a recent
// start, whose blocks' subject state is in memory, but growing with the age
// of the start. A single get walks only to the next message of the subject.
func (r *reader) get(ctx context.Context, req getRequest, batch bool) ([]stored, bool, error) {
	if batch {
		req.Batch, req.MaxBytes = getBatch, getMaxBytes
	}
	if r.direct {
		msgs, more, err := r.getDirect(ctx, req)
		if !errors.Is(err, jsget.ErrNoDirect) {
			return msgs, more, err
		}
		r.direct = false
	}
	m, err := r.getOne(ctx, req)
	if err != nil || m == nil {
		return nil, false, err
	}
	return []stored{*m}, true, nil
}

// getDirect sends one batched direct get and reads its answers up to the end
// of the batch.
func (r *reader) getDirect(ctx context.Context, req getRequest) ([]stored, bool, error) {
	if r.sub == nil {
		r.inbox = r.nc.NewInbox()
		sub, err := r.nc.SubscribeSync(r.inbox)
		if err != nil {
			return nil, false, err
		}
		r.sub = sub
	}
	body, err := json.Marshal(req)
	if err != nil {
		return nil, false, err
	}
	if err := r.nc.PublishRequest(jsget.DirectSubject(r.stream, ""), r.inbox, body); err != nil {
		return nil, false, err
	}
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	var msgs []stored
	for {
		m, err := r.sub.NextMsgWithContext(ctx)
		if errors.Is(err, nats.ErrNoResponders) {
			return nil, false, jsget.ErrNoDirect
		}
		if err != nil {
			return nil, false, fmt.Errorf("direct get: %w", err)
		}
		got, err := jsget.Direct(m)
		switch {
		case errors.Is(err, jsget.ErrBatchEnd):
			pending, _ := strconv.ParseUint(m.Header.Get("Nats-Num-Pending"), 10, 64)
			return msgs, pending > 0, nil
		case errors.Is(err, jsget.ErrNoMessage): // nothing (more) on the subject
			return msgs, false, nil
		case err != nil:
			return nil, false, err
		}
		msgs = append(msgs, stored{seq: got.Sequence, time: got.Time, header: got.Header, data: got.Data})
		if req.Batch == 0 {
			return msgs, true, nil
		}
	}
}

// getOne sends one message get: the first message at or after req's
// sequence or time on its subject, or nil when there is none.
func (r *reader) getOne(ctx context.Context, req getRequest) (*stored, error) {
	req.Batch, req.MaxBytes = 0, 0
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	m, err := jsget.Get(ctx, r.nc, r.stream, req)
	if jsget.Absent(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &stored{seq: m.Sequence, time: m.Time, header: m.Header, data: m.Data}, nil
}

func withDefaultTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, getTimeout)
}
