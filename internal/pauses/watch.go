package pauses

import (
	"context"
	"encoding/json"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/oplog"
	"github.com/nats-io/nats.go/jetstream"
)

// Watcher is a worker's copy of the pauses bucket, kept current by one
// watcher of the bucket (oplog.Follower): before the bucket exists it looks
// for it every second, and at once when an operator's confirmation asks.
// Load is the pauses as last read: nil when there is none.
type Watcher = oplog.Copy[Set]

// Watch reads the pauses bucket and follows it until ctx ends. onPut, when
// set, is called from the watcher for every pause put in the bucket (read at
// the start, or put since), once the set includes it and before the
// change's revision counts as applied: it must not block. A bucket that does
// not exist yet is not an error: the watcher finds it once an admin creates
// it.
func Watch(ctx context.Context, js jetstream.JetStream, n broker.Names, log *slog.Logger, onPut func(*Pause)) (*Watcher, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	b := &bucket{log: log, onPut: onPut, pauses: map[string]*Pause{}}
	return oplog.FollowCopy(ctx, js, n.PausesBucket(), "", log, b.apply)
}

// bucket is what the watcher has read of the bucket, by key.
type bucket struct {
	log   *slog.Logger
	onPut func(*Pause)

	mu     sync.Mutex
	pauses map[string]*Pause
}

// apply takes one change of the bucket into the copy: the set first, from
// which point no attempt it stops starts; then what the pause asks of what
// runs already (onPut).
func (b *bucket) apply(set *atomic.Pointer[Set], e jetstream.KeyValueEntry) {
	var put *Pause
	b.mu.Lock()
	if e.Operation() == jetstream.KeyValuePut {
		var p Pause
		if err := json.Unmarshal(e.Value(), &p); err != nil || p.Scope.Key() != e.Key() || p.Validate() != nil {
			// Only admins write the bucket; a pause that does not read is
			// logged loudly and dropped.
			b.log.Error("pause does not decode: ignored", "key", e.Key(), "err", err)
			delete(b.pauses, e.Key())
		} else {
			b.pauses[e.Key()] = &p
			put = &p
		}
	} else {
		delete(b.pauses, e.Key())
	}
	all := make([]*Pause, 0, len(b.pauses))
	for _, p := range b.pauses {
		all = append(all, p)
	}
	set.Store(NewSet(all))
	b.mu.Unlock()
	if put != nil && b.onPut != nil {
		b.onPut(put)
	}
}
