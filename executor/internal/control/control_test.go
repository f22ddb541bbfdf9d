package control

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

func TestRates_OneSecondsBurstThenTheRate(t *testing.T) {
	t.Parallel()
	var r Rates
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ok := 0
	for range 100 {
		if took, _ := r.Take("alice", 10, t0); took {
			ok++
		}
	}
	if ok != 10 {
		t.Fatalf("alice took %d of 100 at one instant, want her burst of 10", ok)
	}
	took, wait := r.Take("alice", 10, t0)
	if took || wait != 100*time.Millisecond {
		t.Fatalf("over her burst: took %v, retry after %v, want 100ms", took, wait)
	}
	// Bob's bucket is his own.
	if took, _ := r.Take("bob", 10, t0); !took {
		t.Fatal("bob refused for alice's flood")
	}
	// A tenth of a second gives alice one more, and a long pause no more than her burst.
	if took, _ := r.Take("alice", 10, t0.Add(100*time.Millisecond)); !took {
		t.Fatal("alice refused after 100 ms at 10/s")
	}
	if took, _ := r.Take("alice", 10, t0.Add(100*time.Millisecond)); took {
		t.Fatal("alice took two tokens from 100 ms at 10/s")
	}
	ok = 0
	for range 100 {
		if took, _ := r.Take("alice", 10, t0.Add(time.Hour)); took {
			ok++
		}
	}
	if ok != 10 {
		t.Fatalf("after an hour alice took %d, want her burst of 10", ok)
	}
	// A lower quota applies at once; no quota takes nothing.
	if took, _ := r.Take("alice", 1, t0.Add(2*time.Hour)); !took {
		t.Fatal("alice refused under her new quota")
	}
	if took, _ := r.Take("alice", 1, t0.Add(2*time.Hour)); took {
		t.Fatal("alice took a second token of a quota of 1")
	}
	if took, _ := r.Take("alice", -1, t0.Add(2*time.Hour)); !took {
		t.Fatal("no quota refused")
	}
}

func TestRates_PruneForgetsOnlyFullBuckets(t *testing.T) {
	t.Parallel()
	var r Rates
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for range 5 {
		r.Take("alice", 5, t0)
	}
	r.Take("bob", 5, t0.Add(-2*time.Second))
	r.prune(t0.Add(500 * time.Millisecond))
	if _, ok := r.buckets["alice"]; !ok {
		t.Fatal("alice's empty bucket was forgotten: she would get a new burst")
	}
	if _, ok := r.buckets["bob"]; ok {
		t.Fatal("bob's full bucket was kept")
	}
}

// A principal's jobs that never end hold its share of the slots and no
// more: another principal's job runs while they hold, and the principals
// take turns for the slots that free up. No clock: the test waits for
// events, and would hang (and fail at its deadline) were the gate unfair.
func TestGate_APrincipalsJobsHoldOnlyItsShare(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	g := NewGate(4, 2)
	release := make(chan struct{})
	var started sync.WaitGroup
	started.Add(2)
	var aliceRan int
	var mu sync.Mutex
	for range 50 {
		if !g.Submit("alice", 0, func() {
			mu.Lock()
			aliceRan++
			first := aliceRan <= 2
			mu.Unlock()
			if first {
				started.Done()
			}
			<-release
		}) {
			t.Fatal("alice's job refused without a bound")
		}
	}
	started.Wait()
	bob := make(chan struct{})
	g.Submit("bob", 0, func() { close(bob) })
	select {
	case <-bob:
	case <-ctx.Done():
		t.Fatal("bob's job never ran while alice's held their share")
	}
	mu.Lock()
	if aliceRan != 2 {
		t.Errorf("alice ran %d jobs at once, want her share of 2", aliceRan)
	}
	mu.Unlock()
	close(release)
	g.Stop()
	if aliceRan != 50 {
		t.Errorf("alice ran %d of her 50 jobs by the gate's stop, want all", aliceRan)
	}
}

// Waiting jobs are taken in turns: with one slot, principals' jobs
// alternate whatever order they were submitted in.
func TestGate_TakesTurns(t *testing.T) {
	t.Parallel()
	g := NewGate(1, 1)
	hold := make(chan struct{})
	g.Submit("x", 0, func() { <-hold }) // keeps the slot while the others queue
	var mu sync.Mutex
	var order []string
	add := func(p string, i int) {
		if !g.Submit(p, 0, func() { mu.Lock(); order = append(order, fmt.Sprint(p, i)); mu.Unlock() }) {
			t.Fatal("refused")
		}
	}
	for i := range 4 {
		add("alice", i)
	}
	add("bob", 0)
	add("carol", 0)
	add("bob", 1)
	close(hold)
	g.Stop()
	want := []string{"alice0", "bob0", "carol0", "alice1", "bob1", "alice2", "alice3"}
	if fmt.Sprint(order) != fmt.Sprint(want) {
		t.Fatalf("order %v, want %v", order, want)
	}
}

func TestGate_BoundsWhatAPrincipalQueues(t *testing.T) {
	t.Parallel()
	g := NewGate(1, 1)
	hold := make(chan struct{})
	g.Submit("x", 0, func() { <-hold })
	for i := range 3 {
		if !g.Submit("alice", 3, func() {}) {
			t.Fatalf("alice's job %d refused under her bound of 3", i)
		}
	}
	if g.Submit("alice", 3, func() {}) {
		t.Fatal("alice's fourth waiting job taken over her bound of 3")
	}
	if g.Waiting("alice") != 3 || !g.Submit("bob", 3, func() {}) {
		t.Fatal("bob's job refused for alice's")
	}
	close(hold)
	g.Stop()
	if g.Submit("bob", 0, func() {}) {
		t.Fatal("a stopped gate took a job")
	}
}
