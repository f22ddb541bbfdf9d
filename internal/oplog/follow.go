package oplog

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/capstan-dev/capstan/internal/kvwatch"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Follower keeps a worker's copy of a bucket operators write current: one
// watcher of the bucket (or of one key), whose every change it hands to
// apply before the change's revision counts as applied. Before the bucket
// exists (no operator has written it yet) it binds when the server
// announces the bucket's creation (a JetStream advisory: no message until
// then), when Bind is called (an operator's confirmation asks), and, should
// the announcement have been missed, every 30 s. A bucket deleted (an
// admin's nats kv rm) is announced too: the copy then drops what it held of
// it, as a worker starting then finds nothing, and follows the bucket made
// again from its first revision. A bucket purged whole (nats stream purge,
// which no watcher sees) is found at the next of those looks: the copy
// drops what it held and reads the bucket again.
type Follower struct {
	ctx    context.Context
	stop   context.CancelFunc
	js     jetstream.JetStream
	bucket string
	key    string // "" for every key
	log    *slog.Logger
	apply  func(jetstream.KeyValueEntry)

	mu      sync.Mutex
	rev     uint64            // the newest revision applied
	keys    map[string]uint64 // the keys whose last change applied is a put, and its revision
	changed chan struct{}     // closed at the next change
	watch   jetstream.KeyWatcher
	ended   chan struct{} // closed once watch has applied its last entry
	bindMu  sync.Mutex    // one bind at a time
	bindNow chan struct{}
	done    chan struct{}
}

// lookAgain is how often a follower whose bucket does not exist looks for
// it, in case the announcement of its creation was missed (a reconnect).
var lookAgain = 30 * time.Second

// Follow reads bucket (its key key, or every key for "") and follows it
// until ctx ends or Stop, calling apply with each entry, on one goroutine,
// in order. A bucket that does not exist yet is not an error.
func Follow(ctx context.Context, js jetstream.JetStream, bucket, key string, log *slog.Logger, apply func(jetstream.KeyValueEntry)) (*Follower, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, stop := context.WithCancel(ctx)
	f := &Follower{ctx: ctx, stop: stop, js: js, bucket: bucket, key: key, log: log, apply: apply,
		keys: map[string]uint64{}, changed: make(chan struct{}), bindNow: make(chan struct{}, 1), done: make(chan struct{})}
	// Listening for the bucket's creation (and deletion) before the first
	// look, and the server knowing it: a bucket created in between is
	// announced here.
	events := make(chan *nats.Msg, 4)
	var subs []*nats.Subscription
	var err error
	for _, what := range []string{streamCreated, streamDeleted} {
		var sub *nats.Subscription
		if sub, err = js.Conn().ChanSubscribe(what+"KV_"+bucket, events); err != nil {
			break
		}
		subs = append(subs, sub)
	}
	if err == nil {
		err = js.Conn().FlushTimeout(10 * time.Second)
	}
	if err == nil {
		if err = f.bind(); errors.Is(err, jetstream.ErrBucketNotFound) {
			err = nil
		}
	}
	if err != nil {
		stop()
		unsubscribe(subs)
		return nil, err
	}
	go f.keepBound(subs, events)
	return f, nil
}

// Changed is closed at the next change applied.
func (f *Follower) Changed() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.changed
}

// Revision is the bucket's newest revision applied (0: none).
func (f *Follower) Revision() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.rev
}

// WaitRevision waits until the copy has applied revision rev of the bucket,
// or ctx ends. A follower not watching the bucket yet looks for it at once.
func (f *Follower) WaitRevision(ctx context.Context, rev uint64) error {
	f.Bind()
	for {
		f.mu.Lock()
		have, changed := f.rev, f.changed
		f.mu.Unlock()
		if have >= rev {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("capstan: %s applied up to revision %d, not %d: %w", f.bucket, have, rev, ctx.Err())
		case <-time.After(100 * time.Millisecond):
			f.Bind()
		}
	}
}

// Bind asks the follower to look for the bucket now, if it does not watch
// it yet.
func (f *Follower) Bind() {
	select {
	case f.bindNow <- struct{}{}:
	default:
	}
}

// Stop ends the follower.
func (f *Follower) Stop() {
	if f == nil {
		return
	}
	f.stop()
	f.mu.Lock()
	kw := f.watch
	f.mu.Unlock()
	if kw != nil {
		_ = kw.Stop()
	}
	<-f.done
}

// The server's announcements of a stream created and deleted, its name
// after.
const (
	streamCreated = "$JS.EVENT.ADVISORY.STREAM.CREATED."
	streamDeleted = "$JS.EVENT.ADVISORY.STREAM.DELETED."
)

func unsubscribe(subs []*nats.Subscription) {
	for _, sub := range subs {
		_ = sub.Unsubscribe()
	}
}

// keepBound looks for the bucket until the follower watches it: when the
// server announces its stream's creation (on subs, to events), whenever
// Bind asks, and every lookAgain; when the server announces the stream's
// deletion, the copy drops what it held (gone).
func (f *Follower) keepBound(subs []*nats.Subscription, events <-chan *nats.Msg) {
	defer close(f.done)
	defer unsubscribe(subs)
	tick := time.NewTicker(lookAgain)
	defer tick.Stop()
	// The server announces a stream a moment before its account lists it:
	// after an announcement, a look that finds nothing is tried again soon.
	var soon <-chan time.Time
	wait := time.Duration(0)
	for {
		announced := false
		select {
		case <-f.ctx.Done():
			return
		case <-tick.C:
			if f.purged() {
				f.gone()
			}
		case <-f.bindNow:
		case m := <-events:
			switch {
			case strings.HasPrefix(m.Subject, streamCreated):
				announced, wait = true, 10*time.Millisecond
			case strings.HasPrefix(m.Subject, streamDeleted):
				f.gone()
			}
		case <-soon:
			announced, wait = true, min(2*wait, time.Second)
		}
		soon = nil
		f.mu.Lock()
		bound := f.watch != nil
		f.mu.Unlock()
		if bound {
			continue
		}
		err := f.bind()
		if err == nil {
			continue
		}
		if announced && wait < time.Second {
			soon = time.After(wait)
		}
		if !errors.Is(err, jetstream.ErrBucketNotFound) && f.ctx.Err() == nil {
			f.log.Warn("bucket not followed yet; trying again", "bucket", f.bucket, "err", err)
		}
	}
}

// bind opens the bucket and starts the watcher, returning once what it
// holds now is applied.
func (f *Follower) bind() error {
	f.bindMu.Lock()
	defer f.bindMu.Unlock()
	ctx, cancel := context.WithTimeout(f.ctx, 10*time.Second)
	defer cancel()
	kv, err := f.js.KeyValue(ctx, f.bucket)
	if err != nil {
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			return err
		}
		return fmt.Errorf("capstan: bucket %s: %w", f.bucket, err)
	}
	var kw jetstream.KeyWatcher
	if f.key == "" {
		kw, err = kv.WatchAll(f.ctx)
	} else {
		kw, err = kv.Watch(f.ctx, f.key)
	}
	if err != nil {
		return fmt.Errorf("capstan: watch bucket %s: %w", f.bucket, err)
	}
	ended := make(chan struct{})
	ready := kvwatch.FollowThen(kw, func(e jetstream.KeyValueEntry, _ bool) {
		f.apply(e)
		f.mu.Lock()
		if e.Operation() == jetstream.KeyValuePut {
			f.keys[e.Key()] = e.Revision()
		} else {
			delete(f.keys, e.Key())
		}
		f.rev = max(f.rev, e.Revision())
		f.changedLocked()
		f.mu.Unlock()
	}, func() {
		// The watcher ended (stopped): look for the bucket again, keeping
		// what was applied meanwhile.
		f.mu.Lock()
		if f.watch == kw {
			f.watch = nil
		}
		f.mu.Unlock()
		close(ended)
	})
	select {
	case <-ready:
	case <-ctx.Done():
		_ = kw.Stop()
		return fmt.Errorf("capstan: read bucket %s: %w", f.bucket, ctx.Err())
	}
	f.mu.Lock()
	f.watch, f.ended = kw, ended
	f.mu.Unlock()
	return nil
}

// purged reports whether the bucket followed lost a message the copy
// holds: a key's last message comes before the stream's first, which no
// delete marker announced (a purge of the stream).
func (f *Follower) purged() bool {
	f.mu.Lock()
	oldest := uint64(0)
	for _, rev := range f.keys {
		if oldest == 0 || rev < oldest {
			oldest = rev
		}
	}
	bound := f.watch != nil
	f.mu.Unlock()
	if !bound || oldest == 0 {
		return false
	}
	ctx, cancel := context.WithTimeout(f.ctx, 10*time.Second)
	defer cancel()
	st, err := f.js.Stream(ctx, "KV_"+f.bucket)
	return err == nil && st.CachedInfo().State.FirstSeq > oldest
}

// changedLocked tells those waiting on Changed; f.mu is held.
func (f *Follower) changedLocked() {
	close(f.changed)
	f.changed = make(chan struct{})
}

// gone drops what the copy holds of a bucket the server deleted or purged:
// its watcher stopped, every key it holds applied as deleted, its revision
// back to 0 (a bucket made again counts from 1, and no revision of it is
// applied before the follower binds it again).
func (f *Follower) gone() {
	f.bindMu.Lock()
	defer f.bindMu.Unlock()
	f.mu.Lock()
	kw, ended := f.watch, f.ended
	f.watch = nil
	f.mu.Unlock()
	if kw != nil {
		_ = kw.Stop()
		select {
		case <-ended:
		case <-f.ctx.Done():
			return // stopping: nothing more is applied
		}
	}
	f.mu.Lock()
	keys := slices.Sorted(maps.Keys(f.keys))
	clear(f.keys)
	f.mu.Unlock()
	for _, k := range keys {
		f.apply(goneEntry{bucket: f.bucket, key: k})
	}
	f.mu.Lock()
	f.rev = 0
	f.changedLocked()
	f.mu.Unlock()
	if len(keys) > 0 {
		f.log.Warn("bucket deleted or purged: what it held is dropped", "bucket", f.bucket, "keys", len(keys))
	}
}

// goneEntry is a key of a deleted bucket, applied as deleted.
type goneEntry struct{ bucket, key string }

func (e goneEntry) Bucket() string                  { return e.bucket }
func (e goneEntry) Key() string                     { return e.key }
func (e goneEntry) Value() []byte                   { return nil }
func (e goneEntry) Revision() uint64                { return 0 }
func (e goneEntry) Created() time.Time              { return time.Time{} }
func (e goneEntry) Delta() uint64                   { return 0 }
func (e goneEntry) Operation() jetstream.KeyValueOp { return jetstream.KeyValueDelete }
