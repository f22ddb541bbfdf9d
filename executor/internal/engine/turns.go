package engine

import "sync"

// Fair share of the queue (DESIGN §3): a worker pulls from every principal's
// queue at once, one loop per queue, and each loop, holding one delivery,
// waits for a slot in turn. Slots are given first come, first served, so a
// principal whose loop waits is served after at most one delivery of each
// other principal waiting before it: a backlog of one principal's requests
// delays that principal alone.

// turns is a counting semaphore whose waiters are served in the order they
// came.
type turns struct {
	mu      sync.Mutex
	free    int
	waiting []chan struct{}
}

func newTurns(slots int) *turns { return &turns{free: slots} }

// take waits for a slot. wake is the caller's own channel of capacity one,
// reused across takes: a loop waits on it without allocating.
func (t *turns) take(wake chan struct{}) {
	t.mu.Lock()
	if t.free > 0 && len(t.waiting) == 0 {
		t.free--
		t.mu.Unlock()
		return
	}
	t.waiting = append(t.waiting, wake)
	t.mu.Unlock()
	<-wake
}

// give returns a slot: to the longest waiter, if any.
func (t *turns) give() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.waiting) == 0 {
		t.free++
		return
	}
	next := t.waiting[0]
	t.waiting[0] = nil
	t.waiting = t.waiting[1:]
	next <- struct{}{}
}
