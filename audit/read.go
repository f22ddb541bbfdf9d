package audit

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/capstan-dev/capstan/broker"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
)

// clockSlack is how far ahead of the server's clock the clock that made an
// execution id may be for a read from the id's time to find its first event.
const clockSlack = time.Minute

// idTime returns the time a UUIDv7 execution id was made: its first 48 bits,
// milliseconds since the epoch. An id of the MCP bridge (a UUIDv7, a dash
// and a tag) counts as its UUIDv7.
func idTime(executionID string) (time.Time, bool) {
	if len(executionID) < 36 {
		return time.Time{}, false
	}
	u, err := uuid.Parse(executionID[:36])
	if err != nil || u.Version() != 7 || (len(executionID) > 36 && executionID[36] != '-') {
		return time.Time{}, false
	}
	ms := int64(u[0])<<40 | int64(u[1])<<32 | int64(u[2])<<24 | int64(u[3])<<16 | int64(u[4])<<8 | int64(u[5])
	return time.UnixMilli(ms), true
}

// Read returns one execution's trail, oldest first: every event stored on its
// subject up to the end of the stream as Read reaches it. An execution with no
// event fails with an error wrapping broker.ErrNotFound.
//
// Read walks the stream with message gets by subject, so it creates no
// consumer and leaves nothing behind.
func Read(ctx context.Context, b *broker.Broker, executionID string) ([]Event, error) {
	if err := envelope.ValidExecutionID(executionID); err != nil {
		return nil, fmt.Errorf("capstan: %w", err)
	}
	var trail []Event
	for _, subject := range trailSubjects(b.Names, executionID) {
		for seq := uint64(1); ; {
			m, err := b.Audit.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				break
			}
			if err != nil {
				return nil, fmt.Errorf("capstan: read the audit trail of %s: %w", executionID, err)
			}
			seq = m.Sequence + 1
			if !ofExecution(m.Header, executionID) {
				continue
			}
			evs, err := Decode(m.Data)
			if err != nil {
				return nil, fmt.Errorf("%w (stream %s, sequence %d)", err, b.Names.AuditStream(), m.Sequence)
			}
			for _, ev := range evs {
				if ev.ExecutionID == executionID {
					ev.Seq = m.Sequence
					trail = append(trail, ev)
				}
			}
		}
	}
	// Events on the shard and on the subject of earlier versions, as the
	// stream stored them.
	slices.SortStableFunc(trail, func(a, b Event) int { return cmp.Compare(a.Seq, b.Seq) })
	if len(trail) == 0 {
		return nil, fmt.Errorf("%w: no audit events for execution %s", broker.ErrNotFound, executionID)
	}
	return trail, nil
}
