package approvalsrpc

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/kvwatch"
)

// Index is a copy of what the approvals bucket holds, without the inputs,
// kept current by one watcher: what a worker counts a principal's pending
// approvals from (the pendingApprovals quota, DESIGN §12 "Quotas") and
// pages listings from, reading from the bucket only the records a page
// shows. Every worker keeps one; it costs a message per change of an
// approval, and nothing to a deployment without approvals.
type Index struct {
	mu       sync.RWMutex
	recs     map[string]indexed
	pendings map[string]map[string]*approvals.Record // principal → its records written pending
	reserved map[string]int                          // principal → creations under way in this process
	ttl      time.Duration                           // the bucket's: a record older is gone without a word
	kv       jetstream.KeyValue
	watch    jetstream.KeyWatcher
	skipped  func(key string, err error)
	// seen is the last revision the watcher applied; changed is closed
	// (and replaced) whenever it moves.
	seen    uint64
	changed chan struct{}
}

type indexed struct {
	r       *approvals.Record // Input and Display left out
	written time.Time
}

// WatchIndex reads the approvals bucket and follows its changes until ctx
// ends or Stop; it returns once what the bucket holds is read. A record that
// does not decode is left out and reported to skipped (nil: not reported).
func WatchIndex(ctx context.Context, kv jetstream.KeyValue, skipped func(key string, err error)) (*Index, error) {
	x := &Index{recs: map[string]indexed{}, pendings: map[string]map[string]*approvals.Record{}, reserved: map[string]int{},
		kv: kv, skipped: skipped, changed: make(chan struct{})}
	st, err := kv.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("capstan: approvals bucket: %w", err)
	}
	x.ttl = st.TTL()
	// What the initial load covers: the bucket up to here, including what
	// its TTL removed (which no message announces).
	var atStart uint64
	if bs, ok := st.(*jetstream.KeyValueBucketStatus); ok && bs.StreamInfo() != nil {
		atStart = bs.StreamInfo().State.LastSeq
	}
	w, err := kv.WatchAll(ctx)
	if err != nil {
		return nil, fmt.Errorf("capstan: watch approvals: %w", err)
	}
	x.watch = w
	loaded := kvwatch.Follow(w, func(e jetstream.KeyValueEntry, _ bool) { x.apply(e) })
	select {
	case <-loaded:
		x.saw(atStart)
		return x, nil
	case <-ctx.Done():
		_ = w.Stop()
		return nil, fmt.Errorf("capstan: read approvals: %w", ctx.Err())
	}
}

// Stop ends the watcher.
func (x *Index) Stop() {
	if x != nil && x.watch != nil {
		_ = x.watch.Stop()
	}
}

func (x *Index) apply(e jetstream.KeyValueEntry) {
	defer x.saw(e.Revision())
	if e.Operation() != jetstream.KeyValuePut {
		x.mu.Lock()
		x.remove(e.Key())
		x.mu.Unlock()
		return
	}
	var r approvals.Record
	if err := envelope.Unmarshal(e.Value(), &r); err != nil || r.ID != e.Key() {
		if err == nil {
			err = fmt.Errorf("%w: the record names approval %q", envelope.ErrDecode, r.ID)
		}
		x.mu.Lock()
		x.remove(e.Key())
		x.mu.Unlock()
		if x.skipped != nil {
			x.skipped(e.Key(), err)
		}
		return
	}
	x.note(&r, e.Created(), true)
}

func (x *Index) saw(rev uint64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if rev > x.seen {
		x.seen = rev
		close(x.changed)
		x.changed = make(chan struct{})
	}
}

// Sync waits until the index holds everything the bucket held when Sync
// was called (one request for the bucket's last revision): a listing after
// Sync misses nothing written before it, by any process.
func (x *Index) Sync(ctx context.Context) error {
	st, err := x.kv.Status(ctx)
	if err != nil {
		return fmt.Errorf("capstan: approvals bucket: %w", err)
	}
	bs, ok := st.(*jetstream.KeyValueBucketStatus)
	if !ok || bs.StreamInfo() == nil {
		return nil
	}
	last := bs.StreamInfo().State.LastSeq
	for {
		x.mu.RLock()
		seen, changed := x.seen, x.changed
		x.mu.RUnlock()
		if seen >= last {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("capstan: approvals index at revision %d, the bucket at %d: %w", seen, last, ctx.Err())
		}
	}
}

// Noted puts r, which this process has just created, in the index before
// the watcher brings it; what the watcher brings replaces it.
func (x *Index) Noted(r *approvals.Record) { x.note(r, time.Now(), false) }

// note indexes r; a record the index holds already is replaced only by what
// the watcher brings (in the bucket's order), never by what Noted says.
func (x *Index) note(r *approvals.Record, written time.Time, watched bool) {
	s := *r
	s.Input, s.Display = nil, nil
	x.mu.Lock()
	defer x.mu.Unlock()
	if _, ok := x.recs[s.ID]; ok && !watched {
		return
	}
	x.remove(s.ID)
	x.recs[s.ID] = indexed{r: &s, written: written}
	if s.Status == approvals.StatusPending {
		if x.pendings[s.Principal] == nil {
			x.pendings[s.Principal] = map[string]*approvals.Record{}
		}
		x.pendings[s.Principal][s.ID] = &s
	}
}

func (x *Index) remove(id string) {
	if e, ok := x.recs[id]; ok {
		x.forgetPending(e.r)
		delete(x.recs, id)
	}
}

func (x *Index) forgetPending(r *approvals.Record) {
	if set := x.pendings[r.Principal]; set != nil {
		delete(set, r.ID)
		if len(set) == 0 {
			delete(x.pendings, r.Principal)
		}
	}
}

// Select returns the records keep accepts, as the index holds them: without
// their inputs, and with the status they were written with (see
// approvals.Record.StatusAt).
func (x *Index) Select(keep func(r *approvals.Record) bool) []*approvals.Record {
	now := time.Now()
	x.mu.RLock()
	defer x.mu.RUnlock()
	var out []*approvals.Record
	for _, e := range x.recs {
		if x.live(e, now) && keep(e.r) {
			out = append(out, e.r)
		}
	}
	return out
}

// live reports whether the bucket still holds e: its TTL removes a record
// without a change the watcher would see.
func (x *Index) live(e indexed, now time.Time) bool {
	return x.ttl <= 0 || now.Sub(e.written) < x.ttl
}

// Pending returns how many approvals principal requested that are pending
// at now, and when the first of them expires.
func (x *Index) Pending(principal string, now time.Time) (n int, firstExpiry time.Time) {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.pending(principal, now)
}

// pending counts principal's pending records, and forgets those that
// expired since they were written pending: the count costs what principal
// has pending, whatever the others have.
func (x *Index) pending(principal string, now time.Time) (n int, firstExpiry time.Time) {
	for _, r := range x.pendings[principal] {
		if r.StatusAt(now) != approvals.StatusPending {
			x.forgetPending(r)
			continue
		}
		n++
		if firstExpiry.IsZero() || r.ExpiresAt.Before(firstExpiry) {
			firstExpiry = r.ExpiresAt
		}
	}
	return n, firstExpiry
}

// ErrOverQuota: a principal has as many approvals pending as its quota
// allows; Reserve's retryAfter says when the first of them expires.
var ErrOverQuota = errors.New("capstan: pending approvals at the quota")

// Reserve holds one of principal's at most limit pending approvals (limit
// <= 0: no bound) for an approval this process is about to create: it counts
// the pending approvals of the index and the creations under way here. Call
// release once the approval is created (after Noted) or not created. Over
// the quota it fails ErrOverQuota, with how long until the first of
// principal's pending approvals expires.
//
// Workers count from their own index: two workers creating an approval of
// one principal at the same moment may each see room for one more, so a
// principal may exceed its quota by the approvals being created for it on
// other workers within the time a change takes to reach this one.
func (x *Index) Reserve(principal string, limit int64, now time.Time) (release func(), retryAfter time.Duration, err error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	n, first := x.pending(principal, now)
	if limit > 0 && int64(n+x.reserved[principal]) >= limit {
		retryAfter = time.Second
		if !first.IsZero() && first.After(now) {
			retryAfter = first.Sub(now)
		}
		return nil, retryAfter, ErrOverQuota
	}
	x.reserved[principal]++
	var once sync.Once
	return func() {
		once.Do(func() {
			x.mu.Lock()
			defer x.mu.Unlock()
			if x.reserved[principal]--; x.reserved[principal] <= 0 {
				delete(x.reserved, principal)
			}
		})
	}, 0, nil
}
