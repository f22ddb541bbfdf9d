package engine

import (
	"strconv"
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

// Two principals each within its share cannot hold every slot together:
// once all but the reserve are in hand, only a principal holding none
// starts another, one slot at a time, and the two wait for their own calls.
func TestFairShare_TheReserveIsForPrincipalsHoldingNone(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_000_000, 0)
	f := newFairShare(16, nil) // a reserve of 2
	for i := range 14 {
		p := []string{"bob", "mallory"}[i%2]
		if !f.take(p, now) {
			t.Fatalf("%s's delivery %d, outside the reserve, refused", p, i)
		}
	}
	for _, p := range []string{"bob", "mallory"} {
		if f.take(p, now) {
			t.Fatalf("%s, holding slots already, took the reserve", p)
		}
	}
	if !f.take("alice", now) {
		t.Fatal("alice, holding none, refused a slot of the reserve")
	}
	if f.take("alice", now) {
		t.Fatal("alice took a second slot of the reserve")
	}
	if !f.take("carol", now) {
		t.Fatal("carol, holding none, refused the last slot of the reserve")
	}
	f.give("bob")
	if f.take("alice", now) {
		t.Fatal("alice took bob's freed slot while only the reserve's share is free")
	}
	f.give("alice")
	f.give("carol")
	if !f.take("bob", now) {
		t.Fatal("bob refused a slot outside the reserve")
	}
	if f.total != 14 {
		t.Errorf("%d deliveries in hand, want 14 (held %v)", f.total, f.held)
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

// A delivery left for later comes back within 100–300 ms the first time,
// and later ones back off, doubling to 1.6–4.8 s: a backlog held behind a
// principal's long calls is not sent round several times a second.
func TestShareDelay_BacksOffWithEachDelivery(t *testing.T) {
	for _, tt := range []struct {
		n        int
		min, max time.Duration
	}{
		{0, 100 * time.Millisecond, 300 * time.Millisecond},
		{1, 100 * time.Millisecond, 300 * time.Millisecond},
		{2, 200 * time.Millisecond, 600 * time.Millisecond},
		{3, 400 * time.Millisecond, 1200 * time.Millisecond},
		{5, 1600 * time.Millisecond, 4800 * time.Millisecond},
		{6, 1600 * time.Millisecond, 4800 * time.Millisecond},
		{1000, 1600 * time.Millisecond, 4800 * time.Millisecond},
	} {
		for range 200 {
			if d := shareDelay(tt.n); d < tt.min || d >= tt.max {
				t.Fatalf("delivery %d: left for %v, want [%v, %v)", tt.n, d, tt.min, tt.max)
			}
		}
	}
}

// A wait at a limit goes on the trail once every refileWait, however often
// its request comes back; past what a worker remembers, each is filed.
func TestWaitsFiled_OncePerExecutionAndWindow(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_000_000, 0)
	var f waitsFiled
	if !f.first("a", now) || f.first("a", now.Add(time.Second)) || f.first("a", now.Add(refileWait-time.Second)) {
		t.Fatal("a's wait: filed at first, and again within the window")
	}
	if !f.first("b", now) {
		t.Fatal("b's wait not filed beside a's")
	}
	if !f.first("a", now.Add(refileWait)) {
		t.Fatal("a's wait not filed again after the window")
	}
	for i := len(f.at); i < mostWaitsFiled; i++ {
		f.at[strconv.Itoa(i)] = now
	}
	later := now.Add(time.Minute)
	for i := range 2 {
		if !f.first("c", later) {
			t.Fatalf("c's wait not filed the %d time with every entry recent", i+1)
		}
	}
	if !f.first("d", now.Add(refileWait+time.Second)) || len(f.at) >= mostWaitsFiled {
		t.Fatalf("expired entries kept: %d remembered", len(f.at))
	}
	// Well under the bound, entries past the window go every window.
	var g waitsFiled
	g.first("e", now)
	g.first("f", now.Add(refileWait+time.Second))
	if _, kept := g.at["e"]; kept || len(g.at) != 1 {
		t.Errorf("a wait filed a window ago still remembered: %v", g.at)
	}
}
