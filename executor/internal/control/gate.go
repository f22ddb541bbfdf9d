package control

import (
	"slices"
	"sync"
)

// Gate runs jobs on a fixed number of goroutines (its slots), taking turns
// between the principals whose jobs wait: a slot that frees up takes the
// oldest job of the principal whose turn it is, and that principal goes to
// the back of the turns. No principal runs more than share jobs at once, so
// the other slots stay free for the others however long its jobs take.
type Gate struct {
	slots, share int

	mu      sync.Mutex
	cond    *sync.Cond
	waiting map[string][]func()
	turns   []string // principals with waiting jobs, whose turn first
	running map[string]int
	stopped bool
	done    sync.WaitGroup
}

// NewGate starts a gate of slots goroutines, of which one principal holds at
// most share (at least 1, at most slots).
func NewGate(slots, share int) *Gate {
	slots = max(slots, 1)
	g := &Gate{slots: slots, share: min(max(share, 1), slots), waiting: map[string][]func(){}, running: map[string]int{}}
	g.cond = sync.NewCond(&g.mu)
	g.done.Add(slots)
	for range slots {
		go g.serve()
	}
	return g
}

// Submit queues job under principal, unless principal already has
// maxWaiting jobs waiting (maxWaiting <= 0: no bound) or the gate stopped:
// it then reports false and job will not run.
func (g *Gate) Submit(principal string, maxWaiting int, job func()) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	q := g.waiting[principal]
	if g.stopped || (maxWaiting > 0 && len(q) >= maxWaiting) {
		return false
	}
	if len(q) == 0 {
		g.turns = append(g.turns, principal)
	}
	g.waiting[principal] = append(q, job)
	g.cond.Signal()
	return true
}

// Waiting is how many of principal's jobs wait for a slot.
func (g *Gate) Waiting(principal string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.waiting[principal])
}

// Stop takes no more jobs, and returns once every job taken has run.
func (g *Gate) Stop() {
	g.mu.Lock()
	g.stopped = true
	g.cond.Broadcast()
	g.mu.Unlock()
	g.done.Wait()
}

func (g *Gate) serve() {
	defer g.done.Done()
	for {
		g.mu.Lock()
		var job func()
		var principal string
		for {
			if principal, job = g.next(); job != nil || (g.stopped && len(g.turns) == 0) {
				break
			}
			g.cond.Wait()
		}
		if job == nil {
			g.mu.Unlock()
			return
		}
		g.running[principal]++
		g.mu.Unlock()

		job()

		g.mu.Lock()
		if g.running[principal]--; g.running[principal] == 0 {
			delete(g.running, principal)
		}
		g.cond.Broadcast() // its principal may be under its share again
		g.mu.Unlock()
	}
}

// next takes the oldest job of the first principal in turn that runs fewer
// than its share, and sends that principal to the back of the turns.
func (g *Gate) next() (string, func()) {
	for i, p := range g.turns {
		if g.running[p] >= g.share {
			continue
		}
		q := g.waiting[p]
		job := q[0]
		q[0] = nil
		g.turns = slices.Delete(g.turns, i, i+1)
		if len(q) == 1 {
			delete(g.waiting, p)
		} else {
			g.waiting[p] = q[1:]
			g.turns = append(g.turns, p)
		}
		return p, job
	}
	return "", nil
}
