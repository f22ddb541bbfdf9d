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
type Watcher struct {
	*oplog.Follower
	log   *slog.Logger
	onPut func(*Pause)

	set    atomic.Pointer[Set]
	mu     sync.Mutex
	pauses map[string]*Pause
}

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
	w := &Watcher{log: log, onPut: onPut, pauses: map[string]*Pause{}}
	f, err := oplog.Follow(ctx, js, n.PausesBucket(), "", log, w.apply)
	if err != nil {
		return nil, err
	}
	w.Follower = f
	return w, nil
}

// Set is the pauses as last read: nil when there is none.
func (w *Watcher) Set() *Set {
	if w == nil {
		return nil
	}
	return w.set.Load()
}

// Stop ends the watcher.
func (w *Watcher) Stop() {
	if w != nil {
		w.Follower.Stop()
	}
}

// apply takes one change of the bucket into the copy: the set first, from
// which point no attempt it stops starts; then what the pause asks of what
// runs already (onPut).
func (w *Watcher) apply(e jetstream.KeyValueEntry) {
	var put *Pause
	w.mu.Lock()
	if e.Operation() == jetstream.KeyValuePut {
		var p Pause
		if err := json.Unmarshal(e.Value(), &p); err != nil || p.Scope.Key() != e.Key() || p.Validate() != nil {
			// Only admins write the bucket; a pause that does not read is
			// logged loudly and dropped.
			w.log.Error("pause does not decode: ignored", "key", e.Key(), "err", err)
			delete(w.pauses, e.Key())
		} else {
			w.pauses[e.Key()] = &p
			put = &p
		}
	} else {
		delete(w.pauses, e.Key())
	}
	all := make([]*Pause, 0, len(w.pauses))
	for _, p := range w.pauses {
		all = append(all, p)
	}
	w.set.Store(NewSet(all))
	w.mu.Unlock()
	if put != nil && w.onPut != nil {
		w.onPut(put)
	}
}
