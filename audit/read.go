package audit

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/trailhint"
)

const (
	// clockSlack is how far ahead of the server's clock the clock that made
	// an execution id may be for a read from the id's time to find the
	// trail's first event at once.
	clockSlack = 5 * time.Second
	// trailTail is how long after the event that ends a trail (stored time)
	// Read keeps reading for the events that may follow it: a redelivery
	// after a lost acknowledgement (at most a lease after the delivery, 30 s
	// by default), an envelope conflict.
	trailTail = time.Minute
	// recentWindow: a scan of a shard from less than this long ago gets
	// messages in batches (see reader.get); an older one one by one.
	recentWindow = 2 * time.Minute
)

// earlier are the starts, before the id's time, that Read reads from when
// the trail's first event was not found: a minute, an hour, the stream's
// start.
var earlier = []time.Duration{time.Minute, time.Hour, 0}

// idTime returns the time a UUIDv7 execution id was made: its first 48 bits,
// milliseconds since the epoch. An id of the MCP bridge (a UUIDv7, a dash
// and a tag) counts as its UUIDv7.
func idTime(executionID string) (time.Time, bool) {
	if len(executionID) < 36 || (len(executionID) > 36 && executionID[36] != '-') {
		return time.Time{}, false
	}
	u, err := uuid.Parse(executionID[:36])
	if err != nil || u.Version() != 7 {
		return time.Time{}, false
	}
	ms := int64(u[0])<<40 | int64(u[1])<<32 | int64(u[2])<<24 | int64(u[3])<<16 | int64(u[4])<<8 | int64(u[5])
	return time.UnixMilli(ms), true
}

// ErrNoEvents is the error of a trail that holds no event: an execution
// unknown, long gone, or another principal's. Compare with errors.Is.
var ErrNoEvents = fmt.Errorf("%w: no audit events", broker.ErrNotFound)

// Read returns the trail of principal's execution executionID, oldest first,
// in the order its events were emitted. An execution with no event fails with
// an error wrapping ErrNoEvents. Executions are scoped by principal:
// another principal's events under the same id are not part of the trail.
//
// The events are on the execution's shard (broker.AuditShard of its key)
// among those of other executions: Read keeps the ones whose
// Capstan-Execution header names the execution's key (or, in a message of an
// earlier version, whose events name it). For a UUIDv7 id it reads the shard
// from the id's time less five seconds, so that a trail costs the same
// however long the stream is, and stops at the stream's end, or a minute (of
// stored time) after the event that ends the trail (completed, failed,
// cancelled, denied, approved or rejected): an event of the execution stored
// later than that, a request submitted again long after it ended, is in the
// stream, and Follow finds it, but Read does not return it. A trail waiting
// for an approval's decision has no end yet: it is read to the stream's end.
// When the trail's first event (capability.requested) is not among what it
// read (a client whose clock ran ahead made the id), it reads the minute
// before, then the hour before, and, when it found some of the trail but not
// its beginning, the shard from the stream's start. An id with no event from
// an hour before its time is not found. An id that is not a UUIDv7 reads its
// shard from the start, unless its reader knows when it was under way (the
// workers do, from its record or envelope), and then from that time, or
// knows of no such time, and then reads none (internal/trailhint). Stores
// of earlier versions are read too: the shard of the id alone when the key's
// shard has none of the trail, and the subject per execution whenever the
// trail does not begin on the shards.
//
// Read uses direct gets (batched for a recent trail), or message gets on a
// stream that does not allow direct gets: it creates no consumer and leaves
// nothing behind.
func Read(ctx context.Context, nc *nats.Conn, prefix, principal, executionID string) ([]Event, error) {
	n := broker.NewNames(prefix)
	if err := envelope.ValidExecutionID(executionID); err != nil {
		return nil, fmt.Errorf("capstan: %w", err)
	}
	if !broker.ValidPrincipal(principal) {
		return nil, fmt.Errorf("capstan: %q is not a principal", principal)
	}
	if _, v7 := idTime(executionID); !v7 {
		if t, marked := trailhint.Time(ctx); marked && t.IsZero() {
			// Its reader knows of no time it was under way: walking its
			// shard from the start is not worth it.
			return nil, fmt.Errorf("%w for execution %s", ErrNoEvents, executionID)
		}
	}
	r := newReader(nc, n, principal, executionID)
	defer r.close()
	shard := n.AuditSubject(r.key)
	trail, err := r.read(ctx, shard)
	if err != nil {
		return nil, err
	}
	if len(trail) == 0 {
		// Earlier versions sharded by the execution id alone.
		if old := n.AuditSubject(executionID); old != shard {
			if trail, err = r.read(ctx, old); err != nil {
				return nil, err
			}
		}
	}
	if !begins(trail) {
		// The subject's own index finds its few messages: one batch.
		old, err := r.scan(ctx, n.LegacyAuditSubject(executionID), time.Time{}, time.Time{}, false, true)
		if err != nil {
			return nil, err
		}
		trail = merge(old, trail)
	}
	if len(trail) == 0 {
		return nil, fmt.Errorf("%w for execution %s", ErrNoEvents, executionID)
	}
	return trail, nil
}

// read returns the execution's events on one shard: from the id's time, and
// earlier while the trail's beginning is missing (see Read).
func (r *reader) read(ctx context.Context, shard string) ([]Event, error) {
	made, v7 := idTime(r.id)
	if !v7 {
		// An id the caller chose: from when its reader knows it was under
		// way, as from a UUIDv7's time.
		made, v7 = trailhint.Time(ctx)
	}
	from := made.Add(-clockSlack)
	if !v7 {
		from = time.Time{}
	}
	trail, err := r.scan(ctx, shard, from, time.Time{}, true, v7 && time.Since(from) < recentWindow)
	if err != nil {
		return nil, err
	}
	for _, back := range earlier {
		if begins(trail) || !v7 {
			break
		}
		start := time.Time{}
		if back > 0 {
			start = made.Add(-back)
		} else if len(trail) == 0 {
			// Nothing within an hour of the id's time: the id has no trail
			// (a clock more than an hour off is beyond what capstan absorbs
			// anywhere). A trail found without its beginning is read on.
			break
		}
		before, err := r.scan(ctx, shard, start, from, false, !start.IsZero() && time.Since(start) < recentWindow)
		if err != nil {
			return nil, err
		}
		trail, from = merge(before, trail), start
	}
	return trail, nil
}

// begins reports whether the trail holds its first event.
func begins(trail []Event) bool { return len(trail) > 0 && trail[0].Type == EventRequested }

// merge orders the events of two reads as the stream stored them.
func merge(a, b []Event) []Event {
	out := append(a, b...)
	slices.SortStableFunc(out, func(x, y Event) int {
		if c := cmp.Compare(x.Seq, y.Seq); c != 0 {
			return c
		}
		return cmp.Compare(x.Index, y.Index)
	})
	return slices.CompactFunc(out, func(x, y Event) bool { return x.Seq == y.Seq && x.Index == y.Index })
}

// ends reports whether ev ends a trail: after it come only the events of a
// request delivered or finalized again.
func ends(ev *Event) bool {
	switch ev.Type {
	case EventCompleted, EventFailed, EventCancelled, EventDenied, EventApproved, EventRejected:
		return true
	}
	return false
}

// scan returns the execution's events on subject stored from `from` (the
// stream's start when zero) and, when until is not zero, before until. With
// tail it stops trailTail after the trail's end; with batch it gets messages
// in batches.
func (r *reader) scan(ctx context.Context, subject string, from, until time.Time, tail, batch bool) ([]Event, error) {
	var (
		trail []Event
		stop  time.Time
		seq   uint64
	)
	for first := true; ; first = false {
		req := getRequest{NextFor: subject, Seq: seq}
		if first && !from.IsZero() {
			t := from.UTC()
			req.StartTime, req.Seq = &t, 0
		}
		msgs, more, err := r.get(ctx, req, batch)
		if err != nil {
			return nil, fmt.Errorf("capstan: read the audit trail of %s: %w", r.id, err)
		}
		for _, m := range msgs {
			if (!until.IsZero() && !m.time.Before(until)) || (!stop.IsZero() && m.time.After(stop)) {
				return trail, nil
			}
			seq = m.seq + 1
			if !ofExecution(m.header, r.key, r.id) {
				continue
			}
			evs, err := Decode(m.data)
			if err != nil {
				return nil, fmt.Errorf("%w (stream %s, sequence %d)", err, r.stream, m.seq)
			}
			for _, ev := range evs {
				if ev.Key() != r.key {
					continue
				}
				ev.Seq = m.seq
				trail = append(trail, ev)
				if tail && stop.IsZero() && ends(&ev) {
					stop = m.time.Add(trailTail)
				}
			}
		}
		if !more || len(msgs) == 0 {
			return trail, nil
		}
	}
}
