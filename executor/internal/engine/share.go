package engine

import (
	"math/rand/v2"
	"sync"
	"time"
)

// Fair share between principals (DESIGN §17): while this worker pulls
// another principal's queue, or another principal has sent it a request
// lately, the principals already holding a slot may together hold at most
// all but a reserve of the worker's slots, and the reserve goes one slot at
// a time to principals holding none. So neither one principal's backlog of
// long calls nor two principals' together stand in front of every other
// principal's calls — even of one that has sent nothing yet, since a slot
// taken by a long call is not given back for it. A delivery over the share
// is left for later at once, before anything of it is read or written. A
// worker that serves one principal alone lets it use every slot.

// shareWindow is how long a principal counts as active after its last
// delivery.
const shareWindow = 10 * time.Second

// Reserve is the slots of a worker of concurrency slots kept, while several
// principals are active, for principals holding none: an eighth, at least
// one. A worker of one slot reserves none.
func Reserve(slots int) int {
	if slots <= 1 {
		return 0
	}
	return max(1, slots/8)
}

// fairShare counts each principal's deliveries in hand.
type fairShare struct {
	mu    sync.Mutex
	max   int // the slots outside the reserve; 0: no share
	total int // deliveries in hand, of every principal
	held  map[string]int
	seen  map[string]time.Time
	// otherQueue reports whether the worker pulls the queue of a principal
	// other than p (nil: none).
	otherQueue func(p string) bool
}

func newFairShare(slots int, otherQueue func(p string) bool) *fairShare {
	f := &fairShare{held: map[string]int{}, seen: map[string]time.Time{}, otherQueue: otherQueue}
	if r := Reserve(slots); r > 0 {
		f.max = slots - r
	}
	return f
}

// take counts a delivery of p at now, unless p already holds a slot, only
// the reserve is left, and another principal is active or has a queue
// here: then it reports false and counts nothing.
func (f *fairShare) take(p string, now time.Time) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seen[p] = now
	if f.max > 0 && f.held[p] > 0 && f.total >= f.max && (f.othersActive(p, now) || f.otherQueue != nil && f.otherQueue(p)) {
		return false
	}
	f.held[p]++
	f.total++
	return true
}

// give ends a delivery of p that take counted.
func (f *fairShare) give(p string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.total--
	if f.held[p]--; f.held[p] <= 0 {
		delete(f.held, p)
	}
}

// othersActive reports whether a principal other than p had a delivery
// within the window; it forgets the principals idle longer.
func (f *fairShare) othersActive(p string, now time.Time) bool {
	active := false
	for q, at := range f.seen {
		switch {
		case now.Sub(at) > shareWindow:
			delete(f.seen, q)
		case q != p:
			active = true
		}
	}
	return active
}

// shareDelay is how long a delivery over its principal's share waits
// before it is delivered again, at its nth delivery: 100 to 300 ms at the
// first, doubling up to 1.6 to 4.8 s, spread so that deliveries left
// together do not come back together. A request left for later once comes
// back soon; a principal's backlog held back behind its long calls comes
// back every few seconds, not several times a second each.
func shareDelay(n int) time.Duration {
	base := doubled(100*time.Millisecond, n, 4)
	return base + rand.N(2*base)
}

// doubled is how long the nth delivery of a message left for later waits
// before the jitter and cap of its rule: first at the first (or none yet),
// doubling with each delivery after it, at most times times.
func doubled(first time.Duration, n, times int) time.Duration {
	return first << min(max(n-1, 0), times)
}
