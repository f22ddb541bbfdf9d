package engine

import (
	"testing"
	"time"
)

func TestReserve(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ slots, want int }{{0, 0}, {1, 0}, {2, 1}, {8, 1}, {16, 2}, {64, 8}, {256, 32}} {
		if got := Reserve(tc.slots); got != tc.want {
			t.Errorf("Reserve(%d) = %d, want %d", tc.slots, got, tc.want)
		}
	}
}

// One principal alone uses every slot; once another is active it holds at
// most its share, and the other gets the reserve; an idle principal stops
// counting after the window.
func TestFairShare(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_000_000, 0)
	f := newFairShare(8, nil) // a share of 7
	for i := range 8 {
		if !f.take("a", now) {
			t.Fatalf("a alone: delivery %d refused", i)
		}
	}
	if !f.take("b", now) {
		t.Fatal("b's first delivery refused: b holds nothing")
	}
	if f.take("a", now) {
		t.Fatal("a past its share while b is active")
	}
	f.give("a") // 7 left: still its share
	if f.take("a", now) {
		t.Fatal("a at its share while b is active")
	}
	f.give("a")
	f.give("a") // 6
	if !f.take("a", now) {
		t.Fatal("a under its share refused")
	}
	later := now.Add(shareWindow + time.Second) // b idle since
	if !f.take("a", later) {
		t.Fatal("a refused though b has been idle longer than the window")
	}
	if f.max != 7 || f.held["a"] != 7 || f.held["b"] != 1 {
		t.Errorf("held %v, max %d", f.held, f.max)
	}
	one := newFairShare(1, nil)
	one.take("b", now)
	for i := range 2 {
		if !one.take("a", now) {
			t.Errorf("a worker of one slot reserves none: a's delivery %d refused", i)
		}
	}
}

// A principal alone on a worker that also pulls another principal's queue
// holds its share all the same: a long call once started keeps its slot, so
// the reserve must be there before the other principal sends anything.
func TestFairShare_AnotherPrincipalsQueueKeepsTheReserve(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_000_000, 0)
	queues := map[string]bool{"": true, "a": true}
	f := newFairShare(4, func(p string) bool {
		for q := range queues {
			if q != "" && q != p {
				return true
			}
		}
		return false
	})
	for i := range 4 {
		if !f.take("a", now) {
			t.Fatalf("a, the only principal with a queue: delivery %d refused", i)
		}
	}
	for range 4 {
		f.give("a")
	}
	queues["b"] = true
	for i := range 3 {
		if !f.take("a", now) {
			t.Fatalf("a within its share: delivery %d refused", i)
		}
	}
	if f.take("a", now) {
		t.Fatal("a took the reserve while b has a queue here, though b has sent nothing")
	}
	if !f.take("b", now) {
		t.Fatal("b's first delivery refused")
	}
}
