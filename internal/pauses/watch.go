package pauses

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/kvwatch"
	"github.com/capstan-dev/capstan/internal/oplog"
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
	b := &bucket{ctx: ctx, nc: js.Conn(), name: n.PausesBucket(), log: log, onPut: onPut, pauses: map[string]*Pause{}}
	return oplog.FollowCopy(ctx, js, n.PausesBucket(), "", log, b.apply)
}

// decode reads the pause stored under key, as every worker honours it: an
// error when it does not decode, does not validate, or is not of the key's
// scope.
func decode(key string, value []byte) (*Pause, error) {
	var p Pause
	if err := json.Unmarshal(value, &p); err != nil {
		return nil, fmt.Errorf("pause %s does not decode: %w", key, err)
	}
	return &p, honoured(key, &p)
}

// honoured says why the pause p, read under key, is not one a worker
// honours; nil when it is.
func honoured(key string, p *Pause) error {
	if err := p.Validate(); err != nil {
		return fmt.Errorf("pause %s: %w", key, err)
	}
	if k := p.Scope.Key(); k != key {
		return fmt.Errorf("pause %s is of %s, whose key is %s", key, p.Scope, k)
	}
	return nil
}

// bucket is what the watcher has read of the bucket, by key.
type bucket struct {
	ctx   context.Context
	nc    *nats.Conn
	name  string
	log   *slog.Logger
	onPut func(*Pause)

	mu     sync.Mutex
	pauses map[string]*Pause
}

// apply takes one change of the bucket into the copy: the set first, from
// which point no attempt it stops starts; then what the pause asks of what
// runs already (onPut).
func (b *bucket) apply(set *atomic.Pointer[Set], e jetstream.KeyValueEntry) {
	if from, err := kvwatch.Forged(b.ctx, b.nc, b.name, e); from != "" {
		// Not an admin's: what the copy held of the key stands.
		b.log.Error("pause change not honoured: no admin put it", "key", e.Key(), "stored by", from)
		return
	} else if err != nil {
		b.log.Warn("pause change applied unchecked: its stored message could not be read", "key", e.Key(), "err", err)
	}
	var put *Pause
	b.mu.Lock()
	if e.Operation() == jetstream.KeyValuePut {
		if p, err := decode(e.Key(), e.Value()); err != nil {
			// Only admins write the bucket; a pause that does not read is
			// logged loudly and not honoured (capstan pauses names it
			// too). Written over a pause, it lifts nothing: bytes a worker
			// can have the server store there (an answer sent to a reply
			// subject of the bucket's) are no unpause.
			b.log.Error("pause not honoured: ignored", "key", e.Key(), "err", err, "held", b.pauses[e.Key()] != nil)
		} else {
			b.pauses[e.Key()] = p
			put = p
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
