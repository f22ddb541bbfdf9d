package audit

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/textproto"
	"strconv"
	"time"

	"github.com/capstan-dev/capstan/broker"
	"github.com/nats-io/nats.go"
)

// getRequest is JetStream's message get request (direct or not).
type getRequest struct {
	Seq       uint64     `json:"seq,omitempty"`
	NextFor   string     `json:"next_by_subj,omitempty"`
	StartTime *time.Time `json:"start_time,omitempty"`
	// Batch and MaxBytes: direct gets only.
	Batch    int `json:"batch,omitempty"`
	MaxBytes int `json:"max_bytes,omitempty"`
}

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

// errNoDirect marks a stream that does not answer direct gets.
var errNoDirect = errors.New("the stream does not allow direct gets")

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
		if !errors.Is(err, errNoDirect) {
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
	if err := r.nc.PublishRequest("$JS.API.DIRECT.GET."+r.stream, r.inbox, body); err != nil {
		return nil, false, err
	}
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	var msgs []stored
	for {
		m, err := r.sub.NextMsgWithContext(ctx)
		if errors.Is(err, nats.ErrNoResponders) {
			return nil, false, errNoDirect
		}
		if err != nil {
			return nil, false, fmt.Errorf("direct get: %w", err)
		}
		switch status := m.Header.Get("Status"); status {
		case "":
		case "204": // end of the batch
			pending, _ := strconv.ParseUint(m.Header.Get("Nats-Num-Pending"), 10, 64)
			return msgs, pending > 0, nil
		case "404": // nothing (more) on the subject
			return msgs, false, nil
		case "503":
			return nil, false, errNoDirect
		default:
			return nil, false, fmt.Errorf("direct get: status %s %s", status, m.Header.Get("Description"))
		}
		seq, err := strconv.ParseUint(m.Header.Get("Nats-Sequence"), 10, 64)
		if err != nil {
			return nil, false, fmt.Errorf("direct get: sequence %q: %w", m.Header.Get("Nats-Sequence"), err)
		}
		ts, err := time.Parse(time.RFC3339Nano, m.Header.Get("Nats-Time-Stamp"))
		if err != nil {
			return nil, false, fmt.Errorf("direct get: time %q: %w", m.Header.Get("Nats-Time-Stamp"), err)
		}
		msgs = append(msgs, stored{seq: seq, time: ts, header: m.Header, data: m.Data})
		if req.Batch == 0 {
			return msgs, true, nil
		}
	}
}

// getOne sends one message get: the first message at or after req's
// sequence or time on its subject, or nil when there is none.
func (r *reader) getOne(ctx context.Context, req getRequest) (*stored, error) {
	req.Batch, req.MaxBytes = 0, 0
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	resp, err := r.nc.RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET."+r.stream, body)
	if err != nil {
		return nil, fmt.Errorf("message get: %w", err)
	}
	var answer struct {
		Message *struct {
			Sequence uint64    `json:"seq"`
			Header   []byte    `json:"hdrs"`
			Data     []byte    `json:"data"`
			Time     time.Time `json:"time"`
		} `json:"message"`
		Error *struct {
			Code        int    `json:"code"`
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(resp.Data, &answer); err != nil {
		return nil, fmt.Errorf("message get: %w", err)
	}
	switch {
	case answer.Error != nil && answer.Error.Code == 404:
		return nil, nil
	case answer.Error != nil:
		return nil, fmt.Errorf("message get: %d %s", answer.Error.Code, answer.Error.Description)
	case answer.Message == nil:
		return nil, errors.New("message get: an answer without a message")
	}
	m := &stored{seq: answer.Message.Sequence, time: answer.Message.Time, data: answer.Message.Data}
	if len(answer.Message.Header) > 0 {
		if m.header, err = decodeHeader(answer.Message.Header); err != nil {
			return nil, fmt.Errorf("message get: sequence %d: %w", m.seq, err)
		}
	}
	return m, nil
}

func withDefaultTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, getTimeout)
}

// decodeHeader reads the headers of a stored message ("NATS/1.0" and MIME
// lines).
func decodeHeader(b []byte) (nats.Header, error) {
	line, rest, ok := bytes.Cut(b, []byte("\r\n"))
	if !ok || !bytes.HasPrefix(line, []byte("NATS/1.0")) {
		return nil, errors.New("a header without NATS/1.0")
	}
	h, err := textproto.NewReader(bufio.NewReader(bytes.NewReader(rest))).ReadMIMEHeader()
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	return nats.Header(h), nil
}
