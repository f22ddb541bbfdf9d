package limits

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func holder(claim string, until time.Duration) Holder {
	return Holder{Key: "p." + claim, Claim: claim, Until: t0.Add(until)}
}

func claims(hs []Holder) []string {
	out := make([]string, len(hs))
	for i, h := range hs {
		out[i] = h.Claim
	}
	return out
}

func TestTakeSlot(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name      string
		holders   []Holder
		limit     int64
		me        Holder
		ok        bool
		want      []string // the holders written, when ok
		wantStale []string // the holders to check, when not
	}{
		{"a free slot", nil, 1, holder("a", time.Minute), true, []string{"a"}, nil},
		{"the last free slot", []Holder{holder("x", time.Minute)}, 2, holder("a", time.Minute), true, []string{"x", "a"}, nil},
		{"full of live holders", []Holder{holder("x", time.Minute), holder("y", time.Second)}, 2, holder("a", time.Minute), false, nil, nil},
		{"full, one lease passed as recorded: checked, never dropped blind",
			[]Holder{holder("x", -time.Second), holder("y", time.Minute)}, 2, holder("a", time.Minute), false, nil, []string{"x"}},
		{"a lease ending exactly now is stale", []Holder{holder("x", 0)}, 1, holder("a", time.Minute), false, nil, []string{"x"}},
		{"a claim already holding keeps its slot, even when full",
			[]Holder{holder("x", time.Minute), holder("a", time.Second)}, 2, holder("a", time.Minute), true, []string{"x", "a"}, nil},
		{"another claim of the same execution is another holder",
			[]Holder{{Key: "p.a", Claim: "old", Until: t0.Add(time.Minute)}}, 1, holder("a", time.Minute), false, nil, nil},
		{"a limit lowered below its holders takes nobody new",
			[]Holder{holder("x", time.Minute), holder("y", time.Minute), holder("z", time.Minute)}, 2, holder("a", time.Minute), false, nil, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			next, ok, stale, _ := TakeSlot(tt.holders, tt.limit, 0, tt.me, t0)
			if ok != tt.ok {
				t.Fatalf("ok = %v, want %v", ok, tt.ok)
			}
			if ok && !slices.Equal(claims(next), tt.want) {
				t.Errorf("holders written = %v, want %v", claims(next), tt.want)
			}
			if !slices.Equal(claims(stale), tt.wantStale) {
				t.Errorf("stale = %v, want %v", claims(stale), tt.wantStale)
			}
		})
	}
}

// A principal's share of a capability's slots (Limit.PrincipalMax): it
// holds at most share of them, the others always find the rest; a stale
// holder is checked only when its going would let the bidder in.
func TestTakeSlot_PrincipalShare(t *testing.T) {
	t.Parallel()
	of := func(principal, claim string, until time.Duration) Holder {
		return Holder{Key: principal + "." + claim, Claim: claim, Until: t0.Add(until)}
	}
	alice3 := []Holder{of("alice", "a1", time.Minute), of("alice", "a2", time.Minute), of("alice", "a3", time.Minute)}
	for _, tt := range []struct {
		name      string
		holders   []Holder
		limit     int64
		share     int64
		me        Holder
		ok        bool
		wantStale []string
		wantMine  int64
	}{
		{"alice at her share of 3 of 4: refused though a slot is free", alice3, 4, 3, of("alice", "a4", time.Minute), false, nil, 3},
		{"bob finds the slot alice cannot take", alice3, 4, 3, of("bob", "b1", time.Minute), true, nil, 0},
		{"no share: alice takes the last slot", alice3, 4, 0, of("alice", "a4", time.Minute), true, nil, 3},
		{"at her share, only her own stale holders are checked",
			append(slices.Clone(alice3[:2]), of("alice", "a3", -time.Second), of("bob", "b1", -time.Second)), 5, 3,
			of("alice", "a4", time.Minute), false, []string{"a3"}, 3},
		{"full but under her share: anyone's stale holder is checked",
			[]Holder{of("alice", "a1", time.Minute), of("bob", "b1", -time.Second), of("carol", "c1", time.Minute)}, 3, 2,
			of("alice", "a2", time.Minute), false, []string{"b1"}, 1},
		{"a claim already holding keeps its slot, even over the share",
			alice3, 4, 2, of("alice", "a2", time.Minute), true, nil, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			next, ok, stale, mine := TakeSlot(tt.holders, tt.limit, tt.share, tt.me, t0)
			if ok != tt.ok || mine != tt.wantMine {
				t.Fatalf("ok = %v, mine = %d; want %v, %d", ok, mine, tt.ok, tt.wantMine)
			}
			if ok && !slices.ContainsFunc(next, func(h Holder) bool { return h.Claim == tt.me.Claim }) {
				t.Errorf("holders written %v lack the bidder", claims(next))
			}
			if !slices.Equal(claims(stale), tt.wantStale) {
				t.Errorf("stale = %v, want %v", claims(stale), tt.wantStale)
			}
		})
	}
}

func TestTakeSlot_KeptClaimGetsTheLaterLease(t *testing.T) {
	t.Parallel()
	next, ok, _, _ := TakeSlot([]Holder{holder("a", time.Second)}, 1, 0, holder("a", time.Minute), t0)
	if !ok || !next[0].Until.Equal(t0.Add(time.Minute)) {
		t.Fatalf("got %v %v, want the holder's lease moved to a minute", ok, next)
	}
}

func TestHolderAlive(t *testing.T) {
	t.Parallel()
	h := holder("a", -time.Second) // its recorded lease passed
	young := holder("a", time.Second)
	for _, tt := range []struct {
		name      string
		h         Holder
		found     bool
		claim     string
		finalized bool
		lease     time.Duration
		want      Verdict
	}{
		{"no record, its own lease passed: its worker never created it", h, false, "", false, 0, Verdict{Gone: true}},
		{"no record yet, within its own lease: a short path about to create it", young, false, "", false, 0, Verdict{Until: young.Until}},
		{"the record carries another claim: taken over", h, true, "b", false, time.Minute, Verdict{Gone: true}},
		{"the record is finalized", h, true, "a", true, time.Minute, Verdict{Gone: true}},
		{"the record's lease ran out: its worker is lost", h, true, "a", false, -time.Millisecond, Verdict{Gone: true}},
		{"the record's lease was renewed: alive, until it", h, true, "a", false, time.Minute, Verdict{Until: t0.Add(time.Minute)}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := HolderAlive(tt.h, tt.found, tt.claim, tt.finalized, t0.Add(tt.lease), t0)
			if got != tt.want {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestVerdicts_DropTheGoneAndRenewTheAlive(t *testing.T) {
	t.Parallel()
	hs := []Holder{holder("gone", -time.Second), holder("alive", -time.Second), holder("unjudged", time.Minute)}
	next := Verdicts(hs, map[string]Verdict{"gone": {Gone: true}, "alive": {Until: t0.Add(time.Hour)}})
	if !slices.Equal(claims(next), []string{"alive", "unjudged"}) {
		t.Fatalf("holders = %v", claims(next))
	}
	if !next[0].Until.Equal(t0.Add(time.Hour)) {
		t.Errorf("alive holder's lease = %v, want its record's", next[0].Until)
	}
	// Then the bid decides again, without anything stale.
	if _, ok, stale, _ := TakeSlot(next, 2, 0, holder("me", time.Minute), t0); ok || len(stale) != 0 {
		t.Errorf("two live holders of two slots: ok=%v stale=%v", ok, stale)
	}
	if _, ok, _, _ := TakeSlot(next, 3, 0, holder("me", time.Minute), t0); !ok {
		t.Error("a slot freed by a gone holder was not taken")
	}
}

func TestReleaseSlot(t *testing.T) {
	t.Parallel()
	hs := []Holder{holder("a", time.Minute), holder("b", time.Minute)}
	next, held := ReleaseSlot(hs, "a")
	if !held || !slices.Equal(claims(next), []string{"b"}) {
		t.Errorf("release a: %v %v", held, claims(next))
	}
	if !slices.Equal(claims(hs), []string{"a", "b"}) {
		t.Error("release changed its argument")
	}
	if _, held := ReleaseSlot(hs, "zz"); held {
		t.Error("a claim holding nothing released something")
	}
}

func TestTakeRate(t *testing.T) {
	t.Parallel()
	const n = 5
	interval := time.Second // one every 200 ms, a burst of 5
	for _, tt := range []struct {
		name       string
		tat        time.Duration // relative to now
		ok         bool
		next       time.Duration
		retryAfter time.Duration
	}{
		{"idle: admitted, one emission ahead", -time.Hour, true, 200 * time.Millisecond, 0},
		{"never used (zero time)", 0, true, 200 * time.Millisecond, 0},
		{"within the burst", 600 * time.Millisecond, true, 800 * time.Millisecond, 0},
		{"the burst's last", 800 * time.Millisecond, true, time.Second, 0},
		{"past the burst: refused, retry when the tolerance allows", time.Second, false, time.Second, 200 * time.Millisecond},
		{"far past", 3 * time.Second, false, 3 * time.Second, 2200 * time.Millisecond},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tat := t0.Add(tt.tat)
			if tt.tat == 0 && tt.name == "never used (zero time)" {
				tat = time.Time{}
			}
			next, ok, retry := TakeRate(tat, n, interval, t0)
			if ok != tt.ok || retry != tt.retryAfter {
				t.Fatalf("ok=%v retryAfter=%v, want %v %v", ok, retry, tt.ok, tt.retryAfter)
			}
			if !next.Equal(t0.Add(tt.next)) {
				t.Errorf("next = %v, want now+%v", next.Sub(t0), tt.next)
			}
		})
	}
}

func TestTakeRate_RetryAfterIsWhenItAdmits(t *testing.T) {
	t.Parallel()
	tat := t0.Add(3 * time.Second)
	_, _, retry := TakeRate(tat, 5, time.Second, t0)
	if _, ok, _ := TakeRate(tat, 5, time.Second, t0.Add(retry-time.Nanosecond)); ok {
		t.Error("admitted before retryAfter")
	}
	if _, ok, _ := TakeRate(tat, 5, time.Second, t0.Add(retry)); !ok {
		t.Error("not admitted at retryAfter")
	}
}

// In any span of time L, a rate of n per interval admits at most
// n·L/interval + n (the burst), whatever the arrivals: random arrivals
// over ten simulated minutes, every span checked.
func TestTakeRate_NeverMoreThanTheRateAndItsBurst(t *testing.T) {
	t.Parallel()
	const n = 10
	interval := time.Second
	rng := rand.New(rand.NewPCG(1, 2))
	var tat time.Time
	var admitted []time.Time
	now := t0
	for now.Before(t0.Add(10 * time.Minute)) {
		now = now.Add(time.Duration(rng.ExpFloat64() * float64(20*time.Millisecond))) // ~50/s offered
		if next, ok, _ := TakeRate(tat, n, interval, now); ok {
			tat = next
			admitted = append(admitted, now)
		}
	}
	for _, span := range []time.Duration{time.Second, 10 * time.Second, time.Minute} {
		bound := int(n*span/interval) + n
		j := 0
		for i := range admitted {
			for admitted[i].Sub(admitted[j]) >= span {
				j++
			}
			if got := i - j + 1; got > bound {
				t.Fatalf("%d admitted within %v, bound %d", got, span, bound)
			}
		}
	}
	// Offered five times the rate, it admits the rate: 6,000 in ten minutes,
	// give or take the first burst.
	if got := len(admitted); got < 6000-n || got > 6000+n {
		t.Errorf("admitted %d in 10 minutes at 10/s", got)
	}
}

// Two workers whose clocks are d apart share a rate: the one ahead reads
// the other's time as past, so in any span L the rate admits at most
// n·min(d, interval)/interval more than n·L/interval + n — at most one burst
// more, however far apart the clocks (DESIGN §17). Random arrivals on either
// worker, in runs with idle gaps, over ten simulated minutes, every span
// checked.
func TestTakeRate_ClocksApartAdmitAtMostTheirSkewsShareMore(t *testing.T) {
	t.Parallel()
	const n = 10
	interval := time.Second
	for _, d := range []time.Duration{0, interval / 4, interval / 2, interval, 5 * interval, time.Hour} {
		rng := rand.New(rand.NewPCG(3, uint64(d)))
		var tat time.Time
		var admitted []time.Time // in real time
		var extra int
		ahead := false
		for now := t0; now.Before(t0.Add(10 * time.Minute)); {
			// Runs of arrivals on one worker, with idle gaps between some.
			now = now.Add(time.Duration(rng.ExpFloat64() * float64(20*time.Millisecond)))
			if rng.IntN(50) == 0 {
				now = now.Add(time.Duration(rng.Float64() * float64(3*interval)))
			}
			if rng.IntN(20) == 0 {
				ahead = !ahead
			}
			clock := now
			if ahead {
				clock = now.Add(d)
			}
			if next, ok, _ := TakeRate(tat, n, interval, clock); ok {
				tat = next
				admitted = append(admitted, now)
			}
		}
		skew := int((n*min(d, interval) + interval - 1) / interval)
		for _, span := range []time.Duration{time.Second, 10 * time.Second, time.Minute} {
			bound := int(n*span/interval) + n + skew
			j := 0
			for i := range admitted {
				for admitted[i].Sub(admitted[j]) >= span {
					j++
				}
				if got := i - j + 1; got > bound {
					t.Fatalf("clocks %v apart: %d admitted within %v, bound %d", d, got, span, bound)
				}
				extra = max(extra, i-j+1-int(n*span/interval)-n)
			}
		}
		t.Logf("clocks %v apart: at most %d more than the rate and its burst (allowed %d)", d, extra, skew)
	}
}

func TestRefundRate_UndoesOneTake(t *testing.T) {
	t.Parallel()
	tat := t0.Add(500 * time.Millisecond)
	next, ok, _ := TakeRate(tat, 5, time.Second, t0)
	if !ok {
		t.Fatal("not admitted")
	}
	if back := RefundRate(next, 5, time.Second); !back.Equal(tat) {
		t.Errorf("refund = %v, want %v", back, tat)
	}
}

// A rate's time carried to another limit keeps the executions it counts
// ahead, at most the new burst; unchanged, or with nothing counted, it stays.
func TestRescaleRate(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_700_000_000, 0)
	for _, tc := range []struct {
		name      string
		ahead     time.Duration // tat − now under 10 per minute
		m         int64
		every     time.Duration
		wantAhead time.Duration
	}{
		{"same limit", 30 * time.Second, 10, time.Minute, 30 * time.Second},
		{"nothing counted", -time.Second, 100, time.Minute, -time.Second},
		{"raised: 5 counted stay 5", 30 * time.Second, 100, time.Minute, 3 * time.Second},
		{"interval shortened: 5 counted stay 5", 30 * time.Second, 10, 10 * time.Second, 5 * time.Second},
		{"lowered: 5 counted over a burst of 2 are the burst", 30 * time.Second, 2, time.Minute, time.Minute},
	} {
		got := RescaleRate(now.Add(tc.ahead), 10, time.Minute, tc.m, tc.every, now)
		if got.Sub(now) != tc.wantAhead {
			t.Errorf("%s: %v ahead, want %v", tc.name, got.Sub(now), tc.wantAhead)
		}
	}
}

func TestRateUsed(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		ahead time.Duration
		want  int64
	}{{-time.Second, 0}, {0, 0}, {200 * time.Millisecond, 1}, {500 * time.Millisecond, 3}, {time.Second, 5}, {time.Hour, 5}} {
		if got := RateUsed(t0.Add(tt.ahead), 5, time.Second, t0); got != tt.want {
			t.Errorf("tat now+%v: used %d, want %d", tt.ahead, got, tt.want)
		}
	}
}

func TestChargeBudget(t *testing.T) {
	t.Parallel()
	day := 24 * time.Hour
	g := GranuleOf(day) // 24 minutes
	spent := func(amount int64, ago time.Duration) Window {
		w := Window{Granule: g}
		w, _ = ChargeBudget(w, 1<<40, amount, day, "earlier", nil, time.Hour, t0.Add(-ago))
		return w
	}
	seen := func(v int64) *int64 { return &v }
	for _, tt := range []struct {
		name       string
		w          Window
		amount     int64
		key        string
		approvedAt *int64
		ok         bool
		used       int64
		moved      bool
		retryAfter time.Duration // 0: not checked; -1: never
	}{
		{"empty: fits", Window{}, 500, "x", nil, true, 0, false, 0},
		{"fits exactly", spent(1500, time.Hour), 500, "x", nil, true, 1500, false, 0},
		{"over by one: refused until the earlier charge leaves the window", spent(1500, time.Hour), 501, "x", nil, false, 1500, false, day - time.Hour + g},
		{"alone over the maximum: never fits", Window{}, 2001, "x", nil, false, 0, false, -1},
		{"a charge older than the window counts no more", spent(1500, day+g), 2000, "x", nil, true, 0, false, 0},
		{"the same execution again: charged once", spent(1500, time.Hour), 1000, "earlier", nil, true, 1500, false, 0},
		{"approved, the usage its approver saw: charged past the maximum", spent(1500, time.Hour), 800, "x", seen(1500), true, 1500, false, 0},
		{"approved, the usage fell since: charged", spent(1500, day+g), 800, "x", seen(1500), true, 0, false, 0},
		{"approved, but the usage grew since (a racing approval ran first): refused", spent(1500, time.Hour), 800, "x", seen(700), false, 1500, true, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			next, d := ChargeBudget(tt.w, 2000, tt.amount, day, tt.key, tt.approvedAt, time.Hour, t0)
			if d.OK != tt.ok || d.Used != tt.used || d.Moved != tt.moved {
				t.Fatalf("decision %+v, want ok=%v used=%d moved=%v", d, tt.ok, tt.used, tt.moved)
			}
			switch {
			case tt.retryAfter == -1 && d.RetryAfter != 0:
				t.Errorf("retryAfter %v for an amount that never fits", d.RetryAfter)
			case tt.retryAfter > 0 && (d.RetryAfter < tt.retryAfter-g || d.RetryAfter > tt.retryAfter):
				t.Errorf("retryAfter %v, want within a granule before %v", d.RetryAfter, tt.retryAfter)
			}
			after := next.Used(day, t0)
			switch {
			case d.OK && !d.Already && after != addSat(tt.used, tt.amount):
				t.Errorf("usage after the charge %d, want %d", after, tt.used+tt.amount)
			case (!d.OK || d.Already) && after != tt.used:
				t.Errorf("usage changed to %d without a charge", after)
			}
		})
	}
}

func TestChargeBudget_RetryAfterIsWhenItFits(t *testing.T) {
	t.Parallel()
	day := 24 * time.Hour
	var w Window
	for i, ago := range []time.Duration{20 * time.Hour, 10 * time.Hour, time.Hour} {
		w, _ = ChargeBudget(w, 2000, 600, day, string(rune('a'+i)), nil, time.Hour, t0.Add(-ago))
	}
	_, d := ChargeBudget(w, 2000, 700, day, "x", nil, time.Hour, t0) // 1800 used; needs 500 freed
	if d.OK || d.RetryAfter <= 0 {
		t.Fatalf("decision %+v", d)
	}
	if _, d2 := ChargeBudget(w, 2000, 700, day, "x", nil, time.Hour, t0.Add(d.RetryAfter-time.Millisecond)); d2.OK {
		t.Error("fits before retryAfter")
	}
	if _, d2 := ChargeBudget(w, 2000, 700, day, "x", nil, time.Hour, t0.Add(d.RetryAfter)); !d2.OK {
		t.Error("does not fit at retryAfter")
	}
}

// A worker whose clock is d ahead of the one that charged a budget reads
// its window d shorter, never more (DESIGN §17): the whole budget charged
// at t0 is spent again by it from t0 + window − d (to a granule), and by
// neither worker a granule sooner.
func TestChargeBudget_AClockAheadReadsTheWindowShorterByItsSkew(t *testing.T) {
	t.Parallel()
	day := 24 * time.Hour
	g := GranuleOf(day)
	for _, d := range []time.Duration{0, time.Minute, time.Hour} {
		w, c := ChargeBudget(Window{}, 2000, 2000, day, "spent", nil, time.Hour, t0)
		if !c.OK {
			t.Fatalf("the first charge: %+v", c)
		}
		at := t0.Add(day - d) // real time; the worker ahead reads at + d
		if _, c := ChargeBudget(w, 2000, 1, day, "early", nil, time.Hour, at.Add(-g).Add(d)); c.OK {
			t.Errorf("clock %v ahead: charged a granule before the window less the skew ended", d)
		}
		if _, c := ChargeBudget(w, 2000, 1, day, "late", nil, time.Hour, at.Add(g).Add(d)); !c.OK {
			t.Errorf("clock %v ahead: not charged a granule after the window less the skew: %+v", d, c)
		}
	}
}

// Whatever the charges, no span of one window ever holds more than the
// maximum: random amounts at random times over a week of a daily budget.
func TestChargeBudget_NoWindowEverHoldsMoreThanTheMaximum(t *testing.T) {
	t.Parallel()
	day := 24 * time.Hour
	const limit = 2000
	rng := rand.New(rand.NewPCG(3, 4))
	var w Window
	type charge struct {
		at     time.Time
		amount int64
	}
	var charged []charge
	now := t0
	for i := 0; now.Before(t0.Add(7 * day)); i++ {
		now = now.Add(time.Duration(rng.ExpFloat64() * float64(10*time.Minute)))
		amount := 1 + rng.Int64N(400)
		next, d := ChargeBudget(w, limit, amount, day, string(rune(i)), nil, time.Hour, now)
		if d.OK {
			w = next
			charged = append(charged, charge{now, amount})
		}
	}
	j := 0
	var sum int64
	for i := range charged {
		sum += charged[i].amount
		for charged[i].at.Sub(charged[j].at) >= day {
			sum -= charged[j].amount
			j++
		}
		if sum > limit {
			t.Fatalf("%d charged within a day ending %v", sum, charged[i].at)
		}
	}
	if len(charged) < 7*limit/400 {
		t.Errorf("only %d charges in a week", len(charged))
	}
}

func TestRefundBudget_TakesBackOneCharge(t *testing.T) {
	t.Parallel()
	day := 24 * time.Hour
	w, _ := ChargeBudget(Window{}, 2000, 300, day, "a", nil, time.Hour, t0)
	w, _ = ChargeBudget(w, 2000, 500, day, "b", nil, time.Hour, t0)
	w = RefundBudget(w, "b")
	if got := w.Used(day, t0); got != 300 {
		t.Errorf("used %d after refunding b, want 300", got)
	}
	if _, d := ChargeBudget(w, 2000, 500, day, "b", nil, time.Hour, t0); d.Already {
		t.Error("a refunded execution still counts as charged")
	}
}

func TestChargeBudget_RemembersBoundedCharges(t *testing.T) {
	t.Parallel()
	var w Window
	for i := range Remembered + 10 {
		w, _ = ChargeBudget(w, 1<<40, 1, time.Hour, string(rune(1000+i)), nil, time.Hour, t0)
	}
	if len(w.Charged) != Remembered {
		t.Errorf("remembers %d charges, want %d", len(w.Charged), Remembered)
	}
	if got := w.Used(time.Hour, t0); got != Remembered+10 {
		t.Errorf("usage %d, want every charge counted", got)
	}
	w, _ = ChargeBudget(w, 1<<40, 1, time.Hour, "late", nil, time.Hour, t0.Add(2*time.Hour))
	if len(w.Charged) != 1 || len(w.Sums) != 1 {
		t.Errorf("charges older than kept, granules out of the window: %d charges, %d sums left", len(w.Charged), len(w.Sums))
	}
}

func TestWaitFor(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		retryAfter time.Duration
		deliveries int
		jitter     float64
		want       time.Duration
	}{
		{0, 1, 0, 100 * time.Millisecond},
		{0, 2, 0, 200 * time.Millisecond},
		{0, 5, 0, 1600 * time.Millisecond},
		{0, 50, 0, 2 * time.Second},
		{3 * time.Second, 1, 0, 3 * time.Second},
		{3 * time.Second, 1, 1, 3*time.Second + 250*time.Millisecond},
		{0, 1, 1, 125 * time.Millisecond},
	} {
		if got := WaitFor(tt.retryAfter, tt.deliveries, tt.jitter); got != tt.want {
			t.Errorf("WaitFor(%v, %d, %v) = %v, want %v", tt.retryAfter, tt.deliveries, tt.jitter, got, tt.want)
		}
	}
}

func TestLimit_KeysAndWords(t *testing.T) {
	t.Parallel()
	refund := Limit{Kind: Budget, Capability: "orders.refund", Per: PerActor, Who: "user:ann", Name: "amount", Max: 2000, Interval: 24 * time.Hour}
	mail := Limit{Kind: Rate, Capability: "email.send", Per: PerActor, Who: "user:ann", Max: 5, Interval: time.Minute}
	slots := Limit{Kind: Concurrency, Capability: "orders.refund", Max: 2}
	keys := map[string]bool{}
	for _, l := range []Limit{refund, mail, slots,
		{Kind: Rate, Capability: "email.send", Per: PerActor, Who: "user:bob", Max: 5, Interval: time.Minute},
		{Kind: Rate, Capability: "email.send", Per: PerPrincipal, Who: "user:ann", Max: 5, Interval: time.Minute},
		{Kind: Rate, Capability: "email.send", Per: PerCapability, Max: 5, Interval: time.Minute},
		{Kind: Budget, Capability: "orders.refund", Per: PerPrincipal, Who: "user:ann", Name: "amount", Max: 2000, Interval: time.Hour},
		// Slots per principal and per actor, and an actor of one name under
		// two principals (two gateways' user:123): counters of their own.
		{Kind: Concurrency, Capability: "orders.refund", Per: PerPrincipal, Who: "alice", Max: 2},
		{Kind: Concurrency, Capability: "orders.refund", Per: PerPrincipal, Who: "bob", Max: 2},
		{Kind: Concurrency, Capability: "orders.refund", Per: PerActor, Who: ActorWho("alice", "user:123"), Max: 1},
		{Kind: Concurrency, Capability: "orders.refund", Per: PerActor, Who: ActorWho("bob", "user:123"), Max: 1},
		{Kind: Rate, Capability: "email.send", Per: PerActor, Who: ActorWho("alice", "user:123"), Max: 5, Interval: time.Minute},
		{Kind: Rate, Capability: "email.send", Per: PerActor, Who: ActorWho("bob", "user:123"), Max: 5, Interval: time.Minute},
	} {
		k := l.Key()
		if keys[k] {
			t.Errorf("key %s used twice", k)
		}
		keys[k] = true
	}
	// An empty Per is the capability's own, for every kind.
	for _, l := range []Limit{slots, mail, refund} {
		own := l
		own.Per, own.Who = PerCapability, ""
		unset := own
		unset.Per = ""
		if got, want := unset.Key(), own.Key(); got != want {
			t.Errorf("%s with no Per: key %s, want the capability's own %s", l.Kind, got, want)
		}
	}
	for l, want := range map[Limit]string{
		refund: "amount 2000 per 24h per actor",
		mail:   "5 per 1m per actor",
		slots:  "at most 2 running at once",
		{Kind: Concurrency, Capability: "x", Max: 4, PrincipalMax: 3}:                                   "at most 4 running at once, 3 per principal",
		{Kind: Concurrency, Capability: "x", Per: PerActor, Who: "alice/user:1", Max: 1}:                "at most 1 running at once per actor",
		{Kind: Rate, Capability: "x", Per: PerCapability, Max: 10, Interval: time.Second}:               "10 per 1s",
		{Kind: Rate, Capability: "x", Per: PerPrincipal, Max: 10, Interval: 90 * time.Minute}:           "10 per 1h30m per principal",
		{Kind: Budget, Capability: "x", Per: PerPrincipal, Name: "n", Max: 1, Interval: 36 * time.Hour}: "n 1 per 36h per principal",
	} {
		if got := l.String(); got != want {
			t.Errorf("%q, want %q", got, want)
		}
	}
}
