package engine

import (
	"slices"
	"sync"
	"testing"
	"time"
)

// The rule of fair share of the queue (DESIGN §3): slots go to the loops
// waiting for one in the order they came, so a loop that comes back for
// another slot waits behind every other queue's loop already waiting. With
// one principal's loop holding every slot and waiting for more, another
// principal's loop that comes is served after one more of the first's.
func TestTurns_WaitersServedInTheOrderTheyCame(t *testing.T) {
	t.Parallel()
	const slots = 2
	tr := newTurns(slots)
	var mu sync.Mutex
	var order []string
	waiting := func(n int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second) // a safety net only
		for {
			tr.mu.Lock()
			got := len(tr.waiting)
			tr.mu.Unlock()
			if got == n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d loops waiting, want %d", got, n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	// A loop takes a slot per delivery it holds, as a queue's pull loop
	// does, recording whose it is.
	loop := func(who string, deliveries int, done *sync.WaitGroup) {
		defer done.Done()
		wake := make(chan struct{}, 1)
		for range deliveries {
			tr.take(wake)
			mu.Lock()
			order = append(order, who)
			mu.Unlock()
		}
	}
	var done sync.WaitGroup
	done.Add(1)
	go loop("alice", 100, &done)
	waiting(1) // alice holds both slots and waits for a third
	done.Add(1)
	go loop("bob", 1, &done)
	waiting(2) // bob waits behind her
	// One slot at a time, each taken before the next is given: the order
	// recorded is the order slots went in.
	recorded := func(n int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second) // a safety net only
		for {
			mu.Lock()
			got := len(order)
			mu.Unlock()
			if got >= n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d slots taken, want %d", got, n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	for i := range 100 - slots + 1 {
		tr.give()
		recorded(slots + i + 1)
	}
	done.Wait()
	if want := []string{"alice", "alice", "alice", "bob"}; !slices.Equal(order[:4], want) {
		t.Fatalf("slots went to %v, want %v", order[:4], want)
	}
	if n := len(order); n != 101 {
		t.Fatalf("%d slots taken, want 101", n)
	}
}

// A slot given back with nobody waiting is free for the next taker at once.
func TestTurns_FreeSlotsTakenWithoutWaiting(t *testing.T) {
	t.Parallel()
	tr := newTurns(1)
	wake := make(chan struct{}, 1)
	tr.take(wake)
	tr.give()
	tr.take(wake) // would block for ever were the slot not free
	if tr.free != 0 || len(tr.waiting) != 0 {
		t.Fatalf("free %d, waiting %d", tr.free, len(tr.waiting))
	}
}
