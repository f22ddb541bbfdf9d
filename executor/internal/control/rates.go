package control

import (
	"sync"
	"time"
)

// Rates keeps one token bucket per principal: perSecond tokens a second, and
// at most perSecond of them (one second's burst). Take is a pure function of
// the buckets and the time it is given.
type Rates struct {
	mu      sync.Mutex
	buckets map[string]*bucket
	takes   int
}

type bucket struct {
	tokens float64
	at     time.Time
}

// pruneEvery is how many takes pass between two sweeps of the full buckets:
// a principal idle for a second has a full bucket, which is no bucket.
const pruneEvery = 4096

// Take takes one token of principal's bucket at now, whose rate is
// perSecond (a principal's quota changes its rate from its next take). It
// reports whether there was one and, if not, how long until there is.
func (r *Rates) Take(principal string, perSecond int64, now time.Time) (ok bool, retryAfter time.Duration) {
	if perSecond <= 0 {
		return true, 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.buckets == nil {
		r.buckets = map[string]*bucket{}
	}
	if r.takes++; r.takes%pruneEvery == 0 {
		r.prune(now)
	}
	burst := float64(perSecond)
	b := r.buckets[principal]
	if b == nil {
		b = &bucket{tokens: burst, at: now}
		r.buckets[principal] = b
	}
	if elapsed := now.Sub(b.at); elapsed > 0 {
		b.tokens += elapsed.Seconds() * burst
		b.at = now
	}
	b.tokens = min(b.tokens, burst)
	if b.tokens >= 1 {
		b.tokens--
		return true, 0
	}
	wait := time.Duration((1 - b.tokens) / burst * float64(time.Second))
	return false, max(wait, time.Millisecond)
}

// prune forgets the buckets idle for a second or more: full again.
func (r *Rates) prune(now time.Time) {
	for p, b := range r.buckets {
		if now.Sub(b.at) >= time.Second {
			delete(r.buckets, p)
		}
	}
}
