// Package jsget reads a stream's stored messages without a consumer: the
// JetStream message get, which the stream's leader answers, and the direct
// get, which any server of the stream's group answers (a replica still
// catching up among them). Every such request capstan sends, and every
// answer it reads, goes through here.
package jsget

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Request is a get's request: one of Seq, LastFor or NextFor (from Seq or
// StartTime). Batch and MaxBytes are for direct gets only.
type Request struct {
	Seq       uint64     `json:"seq,omitempty"`
	LastFor   string     `json:"last_by_subj,omitempty"`
	NextFor   string     `json:"next_by_subj,omitempty"`
	StartTime *time.Time `json:"start_time,omitempty"`
	Batch     int        `json:"batch,omitempty"`
	MaxBytes  int        `json:"max_bytes,omitempty"`
}

var (
	// ErrNoMessage: the stream holds no message for the request.
	ErrNoMessage = errors.New("no such message")
	// ErrBatchEnd: the answer that ends a batched direct get.
	ErrBatchEnd = errors.New("end of the batch")
	// ErrNoDirect: the stream does not answer direct gets.
	ErrNoDirect = errors.New("the stream does not allow direct gets")
)

// APIError is an error answer of the JetStream API other than ErrNoMessage
// (a missing stream is Code 404).
type APIError struct {
	Code        int    `json:"code"`
	ErrCode     int    `json:"err_code"`
	Description string `json:"description"`
}

func (e *APIError) Error() string {
	return fmt.Sprintf("%s (%d, %d)", e.Description, e.Code, e.ErrCode)
}

// Absent reports whether err says there is nothing to read: no such message,
// or no such stream.
func Absent(err error) bool {
	var api *APIError
	return errors.Is(err, ErrNoMessage) || errors.As(err, &api) && api.Code == 404
}

// noMessage is JetStream's error code for a stream without the message asked
// for.
const noMessage = 10037

// Get sends one message get for req to stream's leader, where absent means
// absent: ErrNoMessage when the stream holds no such message, *APIError for
// any other refusal.
func Get(ctx context.Context, nc *nats.Conn, stream string, req Request) (*jetstream.RawStreamMsg, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	resp, err := nc.RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET."+stream, body)
	if err != nil {
		return nil, fmt.Errorf("message get %s: %w", stream, err)
	}
	var answer struct {
		Message *struct {
			Subject  string    `json:"subject"`
			Sequence uint64    `json:"seq"`
			Header   []byte    `json:"hdrs"`
			Data     []byte    `json:"data"`
			Time     time.Time `json:"time"`
		} `json:"message"`
		Error *APIError `json:"error"`
	}
	if err := json.Unmarshal(resp.Data, &answer); err != nil {
		return nil, fmt.Errorf("message get %s: %w", stream, err)
	}
	switch {
	case answer.Error != nil && answer.Error.ErrCode == noMessage:
		return nil, ErrNoMessage
	case answer.Error != nil:
		return nil, fmt.Errorf("message get %s: %w", stream, answer.Error)
	case answer.Message == nil:
		return nil, fmt.Errorf("message get %s: an answer without a message", stream)
	}
	m := &jetstream.RawStreamMsg{Subject: answer.Message.Subject, Sequence: answer.Message.Sequence,
		Time: answer.Message.Time, Data: answer.Message.Data, Header: nats.Header{}}
	if len(answer.Message.Header) > 0 {
		if m.Header, err = nats.DecodeHeadersMsg(answer.Message.Header); err != nil {
			return nil, fmt.Errorf("message get %s: sequence %d: %w", stream, m.Sequence, err)
		}
	}
	return m, nil
}

// DirectSubject is the subject of a direct get of stream; with a subject,
// of that subject's last message (no request body).
func DirectSubject(stream, subject string) string {
	if subject == "" {
		return "$JS.API.DIRECT.GET." + stream
	}
	return "$JS.API.DIRECT.GET." + stream + "." + subject
}

// Direct reads one answer of a direct get: its message, or ErrNoMessage
// (404), ErrBatchEnd (204: the answer's Nats-Num-Pending says whether more
// follow), ErrNoDirect (503), or another status as an error.
func Direct(m *nats.Msg) (*jetstream.RawStreamMsg, error) {
	status := ""
	if len(m.Data) == 0 { // a stored message's own headers may say anything
		status = m.Header.Get("Status")
	}
	switch status {
	case "":
	case "404":
		return nil, ErrNoMessage
	case "204":
		return nil, ErrBatchEnd
	case "503":
		return nil, ErrNoDirect
	default:
		return nil, fmt.Errorf("direct get: status %s %s", status, m.Header.Get("Description"))
	}
	seq, err := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
	if err != nil {
		return nil, fmt.Errorf("direct get: sequence %q: %w", m.Header.Get(jetstream.SequenceHeader), err)
	}
	ts, err := time.Parse(time.RFC3339Nano, m.Header.Get(jetstream.TimeStampHeaer))
	if err != nil {
		return nil, fmt.Errorf("direct get: time %q: %w", m.Header.Get(jetstream.TimeStampHeaer), err)
	}
	return &jetstream.RawStreamMsg{Subject: m.Header.Get(jetstream.SubjectHeader), Sequence: seq, Time: ts,
		Header: m.Header, Data: m.Data}, nil
}
