// Package execrpc is the sending side of the readings of executions the
// workers serve (DESIGN §12, "Who reads what"): a request on the asking
// principal's subject, answered by any worker. executor.Client's Executions
// and Execution send them; so do the console and the capstan command, whose
// connections (an approver's, an admin's) may not open a Client. The
// requests, the answers and the errors they carry are package executor's.
//
// When no worker answers and the connection may read the index itself (an
// open server's, an admin's), the capstan command lists it as a worker does,
// through ListWithQueued, which package executor sets. Request is how
// every request workers serve is sent: a Client's describe and cancel too.
package execrpc

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/broker"
)

// ErrNoWorkers: no worker answered a request only workers serve
// (executor.ErrNoWorkers).
var ErrNoWorkers = errors.New("capstan: no worker is serving")

// Timeout bounds a reading whose context sets no deadline.
const Timeout = 15 * time.Second

// Answer is a decoded answer that may carry the workers' refusal.
type Answer[R any] interface {
	*R
	Err() error
}

// Ask sends req (its V set) to the subject of the connection's principal
// (broker.PrincipalOf) that subject names, which workers serve, and decodes
// the answer into an R; the refusal it carries is the error. what names the
// request in errors; no worker answering is ErrNoWorkers.
func Ask[R any, P Answer[R]](ctx context.Context, nc *nats.Conn, n broker.Names, subject func(principal string) string, req any, what string) (*R, error) {
	b, err := envelope.Marshal(req)
	if err != nil {
		return nil, err
	}
	data, err := Request(ctx, nc, subject(broker.PrincipalOf(nc, n)), b, Timeout, what)
	if err != nil {
		return nil, err
	}
	reply := new(R)
	if err := envelope.Unmarshal(data, reply); err != nil {
		return nil, fmt.Errorf("capstan: %s: reply: %w", what, err)
	}
	if err := P(reply).Err(); err != nil {
		return nil, err
	}
	return reply, nil
}

// Request sends body on subject, which workers serve, within bound unless
// ctx has a deadline, and returns the answer's data. what names the request
// in errors; no worker answering is ErrNoWorkers.
func Request(ctx context.Context, nc *nats.Conn, subject string, body []byte, bound time.Duration, what string) ([]byte, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, bound)
		defer cancel()
	}
	m, err := nc.RequestWithContext(ctx, subject, body)
	if errors.Is(err, nats.ErrNoResponders) {
		return nil, fmt.Errorf("%w: %s", ErrNoWorkers, what)
	}
	if err != nil {
		return nil, fmt.Errorf("capstan: %s: %w", what, err)
	}
	return m.Data, nil
}

// ListWithQueued is a page of the index (audit.List of q), with, on a
// listing's first page, the requests still waiting in their queue that
// match q first: what a worker answers a listing with, for an admin's command
// to read itself when no worker answers. Set by package executor's init.
var ListWithQueued func(ctx context.Context, b *broker.Broker, q audit.Query, first bool) (entries []audit.Entry, scanned int, next string, err error)

type absenceKey struct{}

// TakeAbsenceAsQueued marks ctx for reads of an execution by a caller that
// takes one found on no replica for one no worker has taken yet, as the MCP
// bridge's polls do. On a cluster, a producer's Status then does not ask
// the workers whether an execution its replica does not hold exists: each
// such question is a control request, counted against the principal's
// quota, and a poller of queued executions would spend it all.
func TakeAbsenceAsQueued(ctx context.Context) context.Context {
	return context.WithValue(ctx, absenceKey{}, true)
}

// AbsenceTakenAsQueued reports whether ctx is marked by TakeAbsenceAsQueued.
func AbsenceTakenAsQueued(ctx context.Context) bool {
	v, _ := ctx.Value(absenceKey{}).(bool)
	return v
}
