package oplog

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/auditemit"
	"github.com/capstan-dev/capstan/internal/broker"
)

// Log files an operator's events: under the principal By, with the person
// at its keyboard (Operator) as the actor.
type Log struct {
	em           *auditemit.Emitter
	by, operator string
}

// New returns the log of by's changes, made on nc.
func New(nc *nats.Conn, n broker.Names, by, operator string) *Log {
	return &Log{em: auditemit.New(nc, auditemit.Options{Prefix: n.Prefix()}), by: by, operator: operator}
}

// Record files an event of type typ under id (of capabilityID, if the
// change is of one capability) and waits until the trail has it.
func (l *Log) Record(ctx context.Context, typ, id, capabilityID string, data map[string]any) error {
	ev := &audit.Event{Type: typ, Principal: l.by, ExecutionID: id, CapabilityID: capabilityID, Actor: l.actor(), Data: data}
	return Retry(ctx, func(ctx context.Context) error { return l.em.EmitSync(ctx, ev) })
}

// NotApplied files, as well as it can, that the change recorded under id
// did not reach bucket, with the error, and returns the error to report:
// changed when another operator's change came first (Changed), else the
// bucket's refusal.
func (l *Log) NotApplied(ctx context.Context, id, capabilityID, bucket string, cause, changed error) error {
	_ = l.em.EmitSync(ctx, &audit.Event{Type: audit.EventNotApplied, Principal: l.by, ExecutionID: envelope.NewExecutionID(),
		CapabilityID: capabilityID, Actor: l.actor(), Data: map[string]any{"auditId": id, "error": cause.Error()}})
	if Changed(cause) {
		return changed
	}
	return fmt.Errorf("capstan: nothing changed: the %s bucket refused the write: %w", bucket, cause)
}

func (l *Log) actor() audit.Actor {
	if l.operator == "" {
		return audit.Actor{Kind: envelope.ActorService, ID: l.by}
	}
	return audit.Actor{Kind: envelope.ActorUser, ID: l.operator}
}
