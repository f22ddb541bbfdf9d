package audit

import (
	"context"
	"errors"
	"fmt"

	"github.com/capstan-dev/capstan/broker"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/nats-io/nats.go/jetstream"
)

// Read returns one execution's trail, oldest first: every event stored on its
// subject up to the end of the stream as Read reaches it. An execution with no
// event fails with an error wrapping broker.ErrNotFound.
//
// Read walks the stream with message gets by subject, one per event, so it
// creates no consumer and leaves nothing behind; a trail is a handful of
// events.
func Read(ctx context.Context, b *broker.Broker, executionID string) ([]Event, error) {
	if err := envelope.ValidExecutionID(executionID); err != nil {
		return nil, fmt.Errorf("capstan: %w", err)
	}
	subject := b.Names.AuditSubject(executionID)
	var trail []Event
	for seq := uint64(1); ; {
		m, err := b.Audit.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("capstan: read the audit trail of %s: %w", executionID, err)
		}
		ev, err := Decode(m.Data)
		if err != nil {
			return nil, fmt.Errorf("%w (stream %s, sequence %d)", err, b.Names.AuditStream(), m.Sequence)
		}
		ev.Seq = m.Sequence
		trail = append(trail, *ev)
		seq = m.Sequence + 1
	}
	if len(trail) == 0 {
		return nil, fmt.Errorf("%w: no audit events for execution %s", broker.ErrNotFound, executionID)
	}
	return trail, nil
}
