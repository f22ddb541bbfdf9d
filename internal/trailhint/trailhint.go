// Package trailhint tells a reading of an execution's audit trail when the
// execution was under way, for an id that does not say it (one the caller
// chose, not a UUIDv7): the reading then starts near that time rather than
// at the audit stream's start, which is one message get for every message
// of the id's shard. The workers serving a principal's reading of an
// execution set it from the execution's record or envelope.
package trailhint

import (
	"context"
	"time"
)

type key struct{}

// WithTime marks ctx with t, a time the execution was under way: when it
// was claimed, or when the worker that ended it took it up. A zero t says
// none is known: the reading reads no trail of such an id.
func WithTime(ctx context.Context, t time.Time) context.Context {
	return context.WithValue(ctx, key{}, t)
}

// Time is the time WithTime marked ctx with; marked is false when it was
// not.
func Time(ctx context.Context) (t time.Time, marked bool) {
	t, marked = ctx.Value(key{}).(time.Time)
	return t, marked
}
