package pauses

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/capstan-dev/capstan/broker"
	"github.com/nats-io/nats.go/jetstream"
)

// Watcher is a worker's copy of the pauses bucket, kept current by one
// watcher of the bucket. Before the bucket exists (no admin has paused
// anything yet) it looks for it every second, and at once when Bind is
// called.
type Watcher struct {
	ctx    context.Context
	stop   context.CancelFunc
	js     jetstream.JetStream
	bucket string
	log    *slog.Logger
	onPut  func(*Pause)

	set atomic.Pointer[Set]

	mu      sync.Mutex
	pauses  map[string]*Pause
	rev     uint64        // the newest revision applied
	changed chan struct{} // closed at the next change
	watch   jetstream.KeyWatcher
	bindMu  sync.Mutex // one bind at a time
	bindNow chan struct{}
	done    chan struct{}
}

// Watch reads the pauses bucket and follows it until ctx ends. onPut, when
// set, is called from the watcher for every pause put in the bucket (read at
// the start, or put since), once the set includes it. A bucket that does
// not exist yet is not an error: the watcher finds it once an admin creates
// it. onPut must not block: it runs before the change's revision counts as
// applied.
func Watch(ctx context.Context, js jetstream.JetStream, n broker.Names, log *slog.Logger, onPut func(*Pause)) (*Watcher, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, stop := context.WithCancel(ctx)
	w := &Watcher{ctx: ctx, stop: stop, js: js, bucket: n.PausesBucket(), log: log, onPut: onPut, pauses: map[string]*Pause{},
		changed: make(chan struct{}), bindNow: make(chan struct{}, 1), done: make(chan struct{})}
	switch err := w.bind(); {
	case errors.Is(err, jetstream.ErrBucketNotFound):
	case err != nil:
		stop()
		return nil, err
	}
	go w.keepBound()
	return w, nil
}

// Set is the pauses as last read: nil when there is none.
func (w *Watcher) Set() *Set {
	if w == nil {
		return nil
	}
	return w.set.Load()
}

// Changed is closed at the next change of the pauses.
func (w *Watcher) Changed() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.changed
}

// Revision is the bucket's newest revision the copy has applied (0: none).
func (w *Watcher) Revision() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.rev
}

// WaitRevision waits until the copy has applied revision rev of the bucket,
// or ctx ends. A copy not watching the bucket yet looks for it at once.
func (w *Watcher) WaitRevision(ctx context.Context, rev uint64) error {
	w.Bind()
	for {
		w.mu.Lock()
		have, changed := w.rev, w.changed
		w.mu.Unlock()
		if have >= rev {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("capstan: pauses applied up to revision %d, not %d: %w", have, rev, ctx.Err())
		case <-time.After(100 * time.Millisecond):
			w.Bind()
		}
	}
}

// Bind asks the watcher to look for the bucket now, if it does not watch it
// yet.
func (w *Watcher) Bind() {
	select {
	case w.bindNow <- struct{}{}:
	default:
	}
}

// Stop ends the watcher.
func (w *Watcher) Stop() {
	if w == nil {
		return
	}
	w.stop()
	w.mu.Lock()
	kw := w.watch
	w.mu.Unlock()
	if kw != nil {
		_ = kw.Stop()
	}
	<-w.done
}

// keepBound looks for the bucket until the watcher watches it, every second
// and whenever Bind asks.
func (w *Watcher) keepBound() {
	defer close(w.done)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-w.ctx.Done():
			return
		case <-tick.C:
		case <-w.bindNow:
		}
		w.mu.Lock()
		bound := w.watch != nil
		w.mu.Unlock()
		if bound {
			continue
		}
		if err := w.bind(); err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) && w.ctx.Err() == nil {
			w.log.Warn("pauses bucket not watched yet; trying again", "err", err)
		}
	}
}

// bind opens the bucket and starts the watcher, returning once the current
// pauses are read.
func (w *Watcher) bind() error {
	w.bindMu.Lock()
	defer w.bindMu.Unlock()
	ctx, cancel := context.WithTimeout(w.ctx, 10*time.Second)
	defer cancel()
	kv, err := w.js.KeyValue(ctx, w.bucket)
	if err != nil {
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			return err
		}
		return fmt.Errorf("capstan: pauses bucket: %w", err)
	}
	kw, err := kv.WatchAll(w.ctx)
	if err != nil {
		return fmt.Errorf("capstan: watch pauses: %w", err)
	}
	ready := make(chan struct{})
	go func() {
		initial := true
		for e := range kw.Updates() {
			if e == nil {
				if initial {
					initial = false
					close(ready)
				}
				continue
			}
			w.apply(e)
		}
		if initial {
			close(ready)
		}
		// The watcher ended (stopped, or its bucket went): look for the
		// bucket again, keeping the pauses known meanwhile.
		w.mu.Lock()
		if w.watch == kw {
			w.watch = nil
		}
		w.mu.Unlock()
	}()
	select {
	case <-ready:
	case <-ctx.Done():
		_ = kw.Stop()
		return fmt.Errorf("capstan: read pauses: %w", ctx.Err())
	}
	w.mu.Lock()
	w.watch = kw
	w.mu.Unlock()
	return nil
}

// apply takes one change of the bucket into the copy.
func (w *Watcher) apply(e jetstream.KeyValueEntry) {
	var put *Pause
	w.mu.Lock()
	if e.Operation() == jetstream.KeyValuePut {
		var p Pause
		if err := json.Unmarshal(e.Value(), &p); err != nil || p.Scope.Key() != e.Key() || p.Validate() != nil {
			// A pause that does not read is still a pause of something: it
			// cannot be honoured as written, so it is logged loudly and
			// dropped (only admins write the bucket).
			w.log.Error("pause does not decode: ignored", "bucket", w.bucket, "key", e.Key(), "err", err)
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
	// The set first: from here no attempt it stops starts; then what the
	// pause asks of what runs already; then the revision, which an
	// operator's confirmation waits for.
	w.set.Store(NewSet(all))
	w.mu.Unlock()
	if put != nil && w.onPut != nil {
		w.onPut(put)
	}
	w.mu.Lock()
	w.rev = max(w.rev, e.Revision())
	close(w.changed)
	w.changed = make(chan struct{})
	w.mu.Unlock()
}
