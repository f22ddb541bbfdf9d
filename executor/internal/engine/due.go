package engine

import (
	"slices"
	"sync"
	"time"
)

// dueQueue calls fire with each value added to it delay after it was added:
// one timer for all of them, armed while any waits. Every value waits the
// same delay, so they fall due in the order they come. Executions put here
// what each would otherwise arm a timer of its own for, and most of them
// end before it: a value whose purpose has passed is made harmless by its
// fire (a generation, a flag), not taken out.
type dueQueue[T any] struct {
	delay time.Duration
	fire  func(T)

	mu    sync.Mutex
	queue []dueValue[T] // due in order, from head
	head  int
	timer *time.Timer
	armed bool
}

type dueValue[T any] struct {
	v   T
	due time.Time
}

// add queues v, to be fired delay from now.
func (q *dueQueue[T]) add(v T) {
	due := time.Now().Add(q.delay)
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.head > 0 && q.head == len(q.queue) {
		q.queue, q.head = q.queue[:0], 0
	}
	q.queue = append(q.queue, dueValue[T]{v: v, due: due})
	if q.armed {
		return
	}
	q.armed = true
	if q.timer == nil {
		q.timer = time.AfterFunc(q.delay, q.fireDue)
	} else {
		q.timer.Reset(q.delay)
	}
}

// fireDue fires the values due, and arms the timer for the next.
func (q *dueQueue[T]) fireDue() {
	now := time.Now()
	q.mu.Lock()
	end := q.head
	for end < len(q.queue) && !q.queue[end].due.After(now) {
		end++
	}
	due := slices.Clone(q.queue[q.head:end])
	clear(q.queue[q.head:end]) // nothing kept past its fire
	q.head = end
	if q.head > 1024 && q.head > len(q.queue)/2 {
		n := copy(q.queue, q.queue[q.head:])
		clear(q.queue[n:])
		q.queue, q.head = q.queue[:n], 0
	}
	if q.head < len(q.queue) {
		q.timer.Reset(q.queue[q.head].due.Sub(now))
	} else {
		q.armed = false
	}
	q.mu.Unlock()
	for _, d := range due {
		q.fire(d.v)
	}
}
