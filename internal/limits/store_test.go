package limits

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// provisioned is a deployment on a real embedded JetStream, for the store's
// wiring; the rules themselves are tested without a server.
func provisioned(t *testing.T) *broker.Broker {
	t.Helper()
	env := testenv.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := broker.Provision(ctx, env.Connect(t), broker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func alwaysAlive(context.Context, Holder) (Verdict, error) {
	return Verdict{Until: time.Now().Add(time.Hour)}, nil
}

// Twenty workers' stores race for three slots: at no moment do more than
// three executions hold one, and every one gets one in the end.
func TestStore_RacingWorkersNeverHoldMoreSlotsThanTheLimit(t *testing.T) {
	t.Parallel()
	b := provisioned(t)
	l := Limit{Kind: Concurrency, Capability: "t.slots", Max: 3, Action: Wait}
	var holding, most, done atomic.Int64
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := NewStore(b, alwaysAlive, nil)
			h := Holder{Key: fmt.Sprintf("p.e%d", i), Claim: fmt.Sprintf("c%d", i), Until: time.Now().Add(time.Minute)}
			for {
				taken, over, err := s.Take(context.Background(), []Limit{l}, h, nil)
				if err != nil {
					t.Error(err)
					return
				}
				if over != nil {
					time.Sleep(time.Millisecond)
					continue
				}
				n := holding.Add(1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				time.Sleep(2 * time.Millisecond)
				holding.Add(-1)
				s.Release(context.Background(), taken)
				done.Add(1)
				return
			}
		}()
	}
	wg.Wait()
	if most.Load() > 3 {
		t.Errorf("%d held a slot at once, limit 3", most.Load())
	}
	if done.Load() != 20 {
		t.Errorf("%d of 20 got a slot", done.Load())
	}
	c, err := NewStore(b, alwaysAlive, nil).Read(context.Background(), l.Key())
	if err != nil || c == nil || len(c.Holders) != 0 {
		t.Errorf("after every release: %+v, %v", c, err)
	}
}

// An execution takes every concurrency limit it is under, all or none: the
// capability's slots (with a share per principal) and its principal's own.
// A principal at its share is refused with its count while another's call
// takes a slot; releasing gives every slot back, and a principal's slots,
// once empty, carry a TTL so that idle callers leave the bucket.
func TestStore_SlotsPerPrincipalAndShare(t *testing.T) {
	t.Parallel()
	b := provisioned(t)
	s := NewStore(b, alwaysAlive, nil)
	ctx := context.Background()
	capWide := Limit{Kind: Concurrency, Capability: "t.report", Per: PerCapability, Max: 4, PrincipalMax: 3, Action: Wait}
	perPrincipal := func(p string) Limit {
		return Limit{Kind: Concurrency, Capability: "t.report", Per: PerPrincipal, Who: p, Max: 2, Action: Wait}
	}
	take := func(p, id string) (Taken, *Over) {
		t.Helper()
		h := Holder{Key: p + "." + id, Claim: id, Until: time.Now().Add(time.Minute)}
		taken, over, err := s.Take(ctx, []Limit{capWide, perPrincipal(p)}, h, nil)
		if err != nil {
			t.Fatal(err)
		}
		return taken, over
	}
	a1, over := take("alice", "a1")
	if over != nil {
		t.Fatalf("alice's first: %+v", over)
	}
	if _, over := take("alice", "a2"); over != nil {
		t.Fatalf("alice's second: %+v", over)
	}
	// Her own limit of 2 refuses the third, and gives back the
	// capability's slot it had taken first.
	if _, over := take("alice", "a3"); over == nil || over.Limit.Per != PerPrincipal || over.Used != 2 {
		t.Fatalf("alice's third: %+v, want her own limit of 2", over)
	}
	if c, _ := s.Read(ctx, capWide.Key()); len(c.Holders) != 2 {
		t.Fatalf("the capability's slots hold %d after a refusal, want 2", len(c.Holders))
	}
	if _, over := take("bob", "b1"); over != nil {
		t.Fatalf("bob: %+v", over)
	}
	s.Release(ctx, a1)
	if c, _ := s.Read(ctx, capWide.Key()); len(c.Holders) != 2 {
		t.Fatalf("the capability's slots hold %d after alice's release, want 2", len(c.Holders))
	}
	if c, _ := s.Read(ctx, perPrincipal("alice").Key()); len(c.Holders) != 1 {
		t.Fatalf("alice's slots hold %d after her release, want 1", len(c.Holders))
	}

	// The share alone: carol may hold 3 of the 4 slots; dave finds the 4th.
	share := Limit{Kind: Concurrency, Capability: "t.shared", Max: 4, PrincipalMax: 3, Action: Wait}
	for i := range 3 {
		h := Holder{Key: fmt.Sprintf("carol.c%d", i), Claim: fmt.Sprintf("c%d", i), Until: time.Now().Add(time.Minute)}
		if _, over, err := s.Take(ctx, []Limit{share}, h, nil); over != nil || err != nil {
			t.Fatalf("carol's %d: %+v %v", i, over, err)
		}
	}
	h := Holder{Key: "carol.c3", Claim: "c3", Until: time.Now().Add(time.Minute)}
	if _, over, _ := s.Take(ctx, []Limit{share}, h, nil); over == nil || over.PrincipalUsed != 3 || over.Used != 3 {
		t.Fatalf("carol's fourth: %+v, want her share of 3 held", over)
	}
	dave, over, err := s.Take(ctx, []Limit{share}, Holder{Key: "dave.d1", Claim: "d1", Until: time.Now().Add(time.Minute)}, nil)
	if over != nil || err != nil {
		t.Fatalf("dave: %+v %v", over, err)
	}

	// Empty, a principal's slots carry a TTL; the capability's never do.
	s.Release(ctx, dave)
	bobs := perPrincipal("bob").Key()
	_, _ = s.change(ctx, bobs, nil, func(c *Counter) bool { c.Holders = nil; return true }) // bob's call ended
	if ttl := msgTTL(t, b, bobs); ttl != EmptySlotsTTL.String() {
		t.Errorf("bob's empty slots carry TTL %q, want %s", ttl, EmptySlotsTTL)
	}
	if ttl := msgTTL(t, b, share.Key()); ttl != "" {
		t.Errorf("the capability's slots carry TTL %q, want none", ttl)
	}
}

// msgTTL is the Nats-TTL header of key's last write.
func msgTTL(t *testing.T, b *broker.Broker, key string) string {
	t.Helper()
	m, err := b.JS.Conn().Request("$JS.API.DIRECT.GET.KV_"+b.Names.LimitsBucket()+".$KV."+b.Names.LimitsBucket()+"."+key, nil, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return m.Header.Get("Nats-TTL")
}

// A holder whose lease has passed as recorded is asked about, not dropped:
// alive, it keeps its slot (with its record's lease); gone, it frees it.
func TestStore_StaleHolderIsJudgedByItsRecord(t *testing.T) {
	t.Parallel()
	b := provisioned(t)
	l := Limit{Kind: Concurrency, Capability: "t.stale", Max: 1, Action: Wait}
	now := time.Now()
	clock := func() time.Time { return now }
	var asked atomic.Int64
	gone := atomic.Bool{}
	alive := func(_ context.Context, h Holder) (Verdict, error) {
		asked.Add(1)
		if gone.Load() {
			return Verdict{Gone: true}, nil
		}
		return Verdict{Until: now.Add(time.Hour)}, nil
	}
	s := NewStore(b, alive, clock)
	first := Holder{Key: "p.first", Claim: "first", Until: now.Add(time.Second)}
	if _, over, err := s.Take(context.Background(), []Limit{l}, first, nil); over != nil || err != nil {
		t.Fatalf("first take: %v %v", over, err)
	}
	second := Holder{Key: "p.second", Claim: "second", Until: now.Add(time.Minute)}
	if _, over, _ := s.Take(context.Background(), []Limit{l}, second, nil); over == nil || asked.Load() != 0 {
		t.Fatalf("within the first's lease: over=%v, records asked %d", over, asked.Load())
	}
	now = now.Add(2 * time.Second) // the first's lease, as recorded, passed
	if _, over, _ := s.Take(context.Background(), []Limit{l}, second, nil); over == nil || asked.Load() != 1 {
		t.Fatalf("first still alive by its record: over=%v, asked %d", over, asked.Load())
	}
	c, _ := s.Read(context.Background(), l.Key())
	if len(c.Holders) != 1 || !c.Holders[0].Until.Equal(now.Add(time.Hour)) {
		t.Errorf("the alive holder's lease was not written back: %+v", c.Holders)
	}
	gone.Store(true)
	now = now.Add(2 * time.Hour)
	if _, over, err := s.Take(context.Background(), []Limit{l}, Holder{Key: "p.second", Claim: "second", Until: now.Add(time.Minute)}, nil); over != nil || err != nil {
		t.Fatalf("first gone by its record: %v %v", over, err)
	}
}

// Twenty racing charges of 150 against a budget of 2,000: thirteen fit, and
// the sum never passes the maximum by a unit.
func TestStore_RacingChargesNeverPassTheBudget(t *testing.T) {
	t.Parallel()
	b := provisioned(t)
	l := Limit{Kind: Budget, Capability: "t.refund", Per: PerActor, Who: "user:ann", Name: "amount", Max: 2000,
		Interval: 24 * time.Hour, Amount: 150, Action: Refuse}
	var charged atomic.Int64
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := NewStore(b, alwaysAlive, nil)
			h := Holder{Key: fmt.Sprintf("p.e%d", i), Claim: fmt.Sprintf("c%d", i)}
			_, over, err := s.Take(context.Background(), []Limit{l}, h, nil)
			if err != nil {
				t.Error(err)
			}
			if over == nil && err == nil {
				charged.Add(150)
			}
		}()
	}
	wg.Wait()
	c, err := NewStore(b, alwaysAlive, nil).Read(context.Background(), l.Key())
	if err != nil {
		t.Fatal(err)
	}
	if used := c.Used(time.Now()); used != charged.Load() || used != 13*150 {
		t.Errorf("budget holds %d, charges that succeeded %d, want %d", used, charged.Load(), 13*150)
	}
}

// An execution charged twice (its first charge's worker was lost before the
// attempt) counts once.
func TestStore_AnExecutionIsChargedOnce(t *testing.T) {
	t.Parallel()
	b := provisioned(t)
	l := Limit{Kind: Budget, Capability: "t.once", Per: PerActor, Who: "user:ann", Name: "amount", Max: 1000,
		Interval: time.Hour, Amount: 600, Action: Refuse}
	for i := range 2 {
		s := NewStore(b, alwaysAlive, nil) // another worker each time
		if _, over, err := s.Take(context.Background(), []Limit{l}, Holder{Key: "p.same", Claim: fmt.Sprint(i)}, nil); over != nil || err != nil {
			t.Fatalf("charge %d: %v %v", i, over, err)
		}
	}
	c, _ := NewStore(b, alwaysAlive, nil).Read(context.Background(), l.Key())
	if used := c.Used(time.Now()); used != 600 {
		t.Errorf("used %d, want 600", used)
	}
}

// A limit that says no gives back what came before it: the rate's
// execution and the slot.
func TestStore_TakeIsAllOrNothing(t *testing.T) {
	t.Parallel()
	b := provisioned(t)
	rate := Limit{Kind: Rate, Capability: "t.all", Per: PerActor, Who: "user:ann", Max: 2, Interval: time.Hour, Action: Refuse}
	slot := Limit{Kind: Concurrency, Capability: "t.all", Max: 5, Action: Refuse}
	budget := Limit{Kind: Budget, Capability: "t.all", Per: PerActor, Who: "user:ann", Name: "n", Max: 10, Interval: time.Hour, Amount: 11, Action: Refuse}
	s := NewStore(b, alwaysAlive, nil)
	_, over, err := s.Take(context.Background(), []Limit{budget, slot, rate}, Holder{Key: "p.x", Claim: "x", Until: time.Now().Add(time.Minute)}, nil)
	if err != nil || over == nil || over.Limit.Kind != Budget || over.RetryAfter != 0 {
		t.Fatalf("over=%+v err=%v, want the budget, never fitting", over, err)
	}
	for _, l := range []Limit{rate, slot} {
		c, _ := s.Read(context.Background(), l.Key())
		if c != nil && c.Used(time.Now()) != 0 {
			t.Errorf("%s still counts %d after the budget refused", l.Kind, c.Used(time.Now()))
		}
	}
	// And two executions of the rate are there to take.
	for i := range 2 {
		if _, over, _ := s.Take(context.Background(), []Limit{rate}, Holder{Key: fmt.Sprintf("p.%d", i), Claim: fmt.Sprint(i)}, nil); over != nil {
			t.Fatalf("take %d of a rate of 2 refused", i)
		}
	}
	if _, over, _ := s.Take(context.Background(), []Limit{rate}, Holder{Key: "p.3", Claim: "3"}, nil); over == nil || over.RetryAfter <= 0 {
		t.Fatalf("third of a rate of 2: over=%+v", over)
	}
}

// Twenty workers' stores race one rate's key, five takes each, at one
// instant (a clock they share, stopped): exactly the burst is admitted;
// one emission interval later, exactly one more.
func TestStore_RacingWorkersNeverTakeMoreThanTheRate(t *testing.T) {
	t.Parallel()
	b := provisioned(t)
	var nanos atomic.Int64
	nanos.Store(time.Now().UnixNano())
	clock := func() time.Time { return time.Unix(0, nanos.Load()) }
	l := Limit{Kind: Rate, Capability: "t.rate", Per: PerCapability, Max: 5, Interval: time.Minute, Action: Refuse}
	race := func(round int) int64 { // each take another execution
		var admitted atomic.Int64
		var wg sync.WaitGroup
		for i := range 20 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s := NewStore(b, alwaysAlive, clock)
				for j := range 5 {
					_, over, err := s.Take(context.Background(), []Limit{l}, Holder{Key: fmt.Sprintf("p.e%d-%d-%d", round, i, j)}, nil)
					if err != nil {
						t.Error(err)
						return
					}
					if over == nil {
						admitted.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		return admitted.Load()
	}
	if n := race(1); n != l.Max {
		t.Errorf("%d admitted at one instant, want the burst of %d", n, l.Max)
	}
	nanos.Add(int64(l.Interval) / l.Max)
	if n := race(2); n != 1 {
		t.Errorf("%d admitted one emission interval later, want 1", n)
	}
}

// A holder gone by its record, in slots no one asks for again (an actor's,
// whose worker was killed, and who never calls again), is freed by a sweep:
// its slots, empty, carry a TTL and leave the bucket. A holder past its
// recorded lease but alive by its record keeps its slot, with its record's
// lease when the slots are written; slots where no one is gone are not
// written; a holder within its lease is not asked about.
func TestStore_SweepFreesSlotsOfHoldersGoneThatNoOneAsksFor(t *testing.T) {
	t.Parallel()
	b := provisioned(t)
	var nanos atomic.Int64
	start := time.Now()
	nanos.Store(start.UnixNano())
	clock := func() time.Time { return time.Unix(0, nanos.Load()) }
	var asked atomic.Int64
	alive := func(_ context.Context, h Holder) (Verdict, error) {
		asked.Add(1)
		if h.Claim == "dead" || h.Claim == "dead2" {
			return Verdict{Gone: true}, nil
		}
		return Verdict{Until: start.Add(time.Hour)}, nil
	}
	s := NewStore(b, alive, clock)
	ctx := context.Background()
	actor := func(who string) Limit {
		return Limit{Kind: Concurrency, Capability: "t.sweep", Per: PerActor, Who: ActorWho("alice", who), Max: 2, Action: Wait}
	}
	take := func(l Limit, claim string, lease time.Duration) {
		t.Helper()
		h := Holder{Key: "alice." + claim, Claim: claim, Until: start.Add(lease)}
		if _, over, err := s.Take(ctx, []Limit{l}, h, nil); over != nil || err != nil {
			t.Fatalf("take %s: %+v %v", claim, over, err)
		}
	}
	if n, err := s.Sweep(ctx); n != 0 || err != nil {
		t.Fatalf("a sweep of no slots freed %d: %v", n, err)
	}
	ann, bob, cid := actor("user:ann"), actor("user:bob"), actor("user:cid")
	take(ann, "dead", time.Second)
	take(bob, "dead2", time.Second)
	take(bob, "long", time.Second)
	take(cid, "long2", time.Second)
	take(cid, "young", time.Minute)

	if n, err := s.Sweep(ctx); n != 0 || err != nil || asked.Load() != 0 {
		t.Fatalf("a sweep within every lease freed %d, asked %d records: %v", n, asked.Load(), err)
	}
	nanos.Add(int64(2 * time.Second)) // the leases of a second, as recorded, passed
	if n, err := s.Sweep(ctx); n != 2 || err != nil || asked.Load() != 4 {
		t.Fatalf("a sweep freed %d, asked %d records, want the 2 dead holders' slots, 4 asked: %v", n, asked.Load(), err)
	}
	c, _ := s.Read(ctx, ann.Key())
	if c == nil || len(c.Holders) != 0 {
		t.Fatalf("ann's slots after the sweep: %+v", c)
	}
	if ttl := msgTTL(t, b, ann.Key()); ttl != EmptySlotsTTL.String() {
		t.Errorf("ann's emptied slots carry TTL %q, want %s", ttl, EmptySlotsTTL)
	}
	c, _ = s.Read(ctx, bob.Key())
	if c == nil || len(c.Holders) != 1 || c.Holders[0].Claim != "long" || !c.Holders[0].Until.Equal(start.Add(time.Hour)) {
		t.Errorf("bob's live holder after the sweep: %+v, want its record's lease", c)
	}
	c, _ = s.Read(ctx, cid.Key())
	if c == nil || len(c.Holders) != 2 || !c.Holders[0].Until.Equal(start.Add(time.Second)) {
		t.Errorf("cid's slots, where no one is gone: %+v, want them as taken", c)
	}
}

// A rate changed while its callers wait carries the executions it counted
// over to the new limit, as many as the new limit holds: raised from 1 per
// hour to 60 per minute after one execution, it admits the new burst's 59
// others at once, not in an hour; lowered from 60 per minute to 2 after 30
// executions, it admits none until one leaves the new limit's interval,
// not the new burst on top of the 30.
func TestStore_ARateChangedCarriesWhatItCountedOver(t *testing.T) {
	t.Parallel()
	b := provisioned(t)
	now := time.Now() // stopped: every take at one instant
	s := NewStore(b, alwaysAlive, func() time.Time { return now })
	ctx := context.Background()
	var executions int
	takes := func(l Limit, n int) (admitted int, over *Over) {
		t.Helper()
		for range n {
			executions++
			_, o, err := s.Take(ctx, []Limit{l}, Holder{Key: fmt.Sprintf("p.e%d", executions)}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if o != nil {
				return admitted, o
			}
			admitted++
		}
		return admitted, nil
	}
	hourly := Limit{Kind: Rate, Capability: "t.raised", Per: PerCapability, Max: 1, Interval: time.Hour, Action: Refuse}
	if n, _ := takes(hourly, 1); n != 1 {
		t.Fatalf("1 per hour admitted %d", n)
	}
	raised := hourly
	raised.Max, raised.Interval = 60, time.Minute
	if n, over := takes(raised, 60); n != 59 || over == nil || over.RetryAfter > time.Second {
		t.Errorf("raised to 60 per minute after 1: %d admitted, then %+v; want 59, then a second at most", n, over)
	}

	fast := Limit{Kind: Rate, Capability: "t.lowered", Per: PerCapability, Max: 60, Interval: time.Minute, Action: Refuse}
	if n, _ := takes(fast, 30); n != 30 {
		t.Fatalf("60 per minute admitted %d of 30", n)
	}
	lowered := fast
	lowered.Max = 2
	if n, over := takes(lowered, 2); n != 0 || over == nil || over.RetryAfter != 30*time.Second {
		t.Errorf("lowered to 2 per minute after 30: %d admitted, then %+v; want none, retry after 30s", n, over)
	}
}

// An execution a rate admitted, taken again (its worker lost before the
// attempt, the request redelivered to another), is counted once; one given
// back (a later limit said no) is counted when it is taken again.
func TestStore_ARateCountsTheExecutionItAdmittedLastOnce(t *testing.T) {
	t.Parallel()
	b := provisioned(t)
	ctx := context.Background()
	rate := Limit{Kind: Rate, Capability: "t.once", Per: PerActor, Who: ActorWho("alice", "user:ann"), Max: 3, Interval: time.Hour, Action: Refuse}
	slot := Limit{Kind: Concurrency, Capability: "t.once", Max: 1, Action: Wait}
	used := func() int64 {
		c, _ := NewStore(b, alwaysAlive, nil).Read(ctx, rate.Key())
		return c.Used(time.Now())
	}
	x := Holder{Key: "alice.x", Claim: "x1", Until: time.Now().Add(time.Minute)}
	for i := range 2 { // another worker each time
		if _, over, err := NewStore(b, alwaysAlive, nil).Take(ctx, []Limit{rate}, x, nil); over != nil || err != nil {
			t.Fatalf("take %d of x: %+v %v", i, over, err)
		}
	}
	if n := used(); n != 1 {
		t.Fatalf("x taken twice counts %d, want 1", n)
	}
	s := NewStore(b, alwaysAlive, nil)
	if _, over, err := s.Take(ctx, []Limit{slot}, Holder{Key: "alice.y", Claim: "y", Until: time.Now().Add(time.Minute)}, nil); over != nil || err != nil {
		t.Fatalf("y's slot: %+v %v", over, err)
	}
	z := Holder{Key: "alice.z", Claim: "z", Until: time.Now().Add(time.Minute)}
	if _, over, _ := s.Take(ctx, []Limit{rate, slot}, z, nil); over == nil || over.Limit.Kind != Concurrency {
		t.Fatalf("z past a full slot: %+v", over)
	}
	if n := used(); n != 1 {
		t.Fatalf("z given back, the rate counts %d, want 1", n)
	}
	if _, over, err := s.Take(ctx, []Limit{rate}, z, nil); over != nil || err != nil {
		t.Fatalf("z taken again: %+v %v", over, err)
	}
	if n := used(); n != 2 {
		t.Errorf("z taken after it was given back: the rate counts %d, want 2", n)
	}
	// Past the record window, an id taken again (a caller that reused it)
	// is counted again.
	later := NewStore(b, alwaysAlive, func() time.Time { return time.Now().Add(b.Config.RecordWindow) })
	if _, over, err := later.Take(ctx, []Limit{rate}, z, nil); over != nil || err != nil {
		t.Fatalf("z again past the record window: %+v %v", over, err)
	}
	if n := used(); n != 3 {
		t.Errorf("z taken again past the record window: the rate counts %d, want 3", n)
	}
}
