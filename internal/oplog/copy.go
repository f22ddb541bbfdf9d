package oplog

import (
	"context"
	"log/slog"
	"sync/atomic"

	"github.com/nats-io/nats.go/jetstream"
)

// Copy is a worker's copy of a bucket operators write, as the one value
// (a set of pauses, the policy set in force) that its apply makes of the
// bucket's changes, read without a lock. A nil Copy holds nothing.
type Copy[T any] struct {
	*Follower
	v atomic.Pointer[T]
}

// FollowCopy follows bucket (its key key, or every key for "") as Follow
// does, into a new Copy: apply takes each change into the copy's value.
func FollowCopy[T any](ctx context.Context, js jetstream.JetStream, bucket, key string, log *slog.Logger,
	apply func(v *atomic.Pointer[T], e jetstream.KeyValueEntry)) (*Copy[T], error) {
	c := &Copy[T]{}
	f, err := Follow(ctx, js, bucket, key, log, func(e jetstream.KeyValueEntry) { apply(&c.v, e) })
	if err != nil {
		return nil, err
	}
	c.Follower = f
	return c, nil
}

// Fixed is a copy that holds v for ever and follows no bucket.
func Fixed[T any](v *T) *Copy[T] {
	c := &Copy[T]{}
	c.v.Store(v)
	return c
}

// Load is the value as last applied.
func (c *Copy[T]) Load() *T {
	if c == nil {
		return nil
	}
	return c.v.Load()
}

// Stop ends the copy's follower.
func (c *Copy[T]) Stop() {
	if c != nil {
		c.Follower.Stop()
	}
}
