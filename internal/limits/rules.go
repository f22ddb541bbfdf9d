package limits

import (
	"math"
	"slices"
	"strings"
	"time"
)

// The rules of the limits, pure functions of a counter's value, the limit
// and the time (DESIGN §17). The store reads and swaps; these decide.

// Holder is one execution holding a concurrency slot: its key (principal
// and execution id), the claim that took it, and the lease it had then.
// The execution's record is the truth of the lease: a holder whose Until has
// passed is checked there before it is counted as gone (Verdicts).
type Holder struct {
	Key    string    `json:"key"`
	Claim  string    `json:"claim"`
	Until  time.Time `json:"until"`
	Worker string    `json:"worker,omitempty"`
}

// TakeSlot decides whether me may hold one of limit slots held by holders at
// now, when one principal may hold at most share of them (0: no bound but
// limit). ok: next is the holders to write (me among them; a claim already
// holding one keeps it). Not ok: stale lists the holders whose lease, as
// recorded, has passed and whose going would let me in — any holder when
// the slots are full, one of me's principal when its share is held: they may
// be gone, and their records say (Verdicts); none stale means live holders
// fill what me needs. mine counts the slots me's principal holds.
func TakeSlot(holders []Holder, limit, share int64, me Holder, now time.Time) (next []Holder, ok bool, stale []Holder, mine int64) {
	if i := slices.IndexFunc(holders, func(h Holder) bool { return h.Claim == me.Claim }); i >= 0 {
		next = slices.Clone(holders)
		next[i].Until = maxTime(next[i].Until, me.Until)
		return next, true, nil, 0
	}
	principal := me.Principal()
	for _, h := range holders {
		if h.Principal() == principal {
			mine++
		}
	}
	overShare := share > 0 && mine >= share
	if int64(len(holders)) < limit && !overShare {
		return append(slices.Clone(holders), me), true, nil, mine
	}
	for _, h := range holders {
		if !now.Before(h.Until) && (!overShare || h.Principal() == principal) {
			stale = append(stale, h)
		}
	}
	return nil, false, stale, mine
}

// Principal is whose execution holds the slot: the first token of its key
// (broker.Key, <principal>.<executionId>).
func (h Holder) Principal() string {
	p, _, _ := strings.Cut(h.Key, ".")
	return p
}

// Verdict is what an execution's record says of a stale holder: Gone, or
// alive until Until (the lease its record carries now).
type Verdict struct {
	Gone  bool
	Until time.Time
}

// Verdicts applies what the records said of stale holders (by claim) to
// holders: the gone are dropped, the alive carry their record's lease.
// Holders without a verdict are kept as they are.
func Verdicts(holders []Holder, verdicts map[string]Verdict) []Holder {
	next := make([]Holder, 0, len(holders))
	for _, h := range holders {
		v, judged := verdicts[h.Claim]
		switch {
		case !judged:
		case v.Gone:
			continue
		default:
			h.Until = maxTime(h.Until, v.Until)
		}
		next = append(next, h)
	}
	return next
}

// HolderAlive judges a holder from its execution's record, as read: found
// (false: no record), the claim the record carries, whether it is
// finalized, and its lease. A holder is alive while the record carries its
// claim, is not finalized and its lease has not run out. A holder whose
// record does not exist yet is alive until its own Until: a short path's
// claim takes its slot before it creates its record.
func HolderAlive(h Holder, found bool, claim string, finalized bool, leaseUntil, now time.Time) Verdict {
	switch {
	case !found:
		if now.Before(h.Until) {
			return Verdict{Until: h.Until}
		}
		return Verdict{Gone: true}
	case claim != h.Claim, finalized, !now.Before(leaseUntil):
		return Verdict{Gone: true}
	}
	return Verdict{Until: leaseUntil}
}

// ReleaseSlot removes claim's slot, if it holds one.
func ReleaseSlot(holders []Holder, claim string) (next []Holder, held bool) {
	i := slices.IndexFunc(holders, func(h Holder) bool { return h.Claim == claim })
	if i < 0 {
		return holders, false
	}
	return slices.Delete(slices.Clone(holders), i, i+1), true
}

// TakeRate is the generic cell rate algorithm: a rate of n per interval
// keeps one time, tat (the theoretical arrival time of the next execution),
// and admits an execution at now unless tat is more than interval − interval/n
// ahead of now, which lets a burst of n through at once and then one every
// interval/n. ok: next is the time to write. Not ok: retryAfter is how long
// until it would admit one.
func TakeRate(tat time.Time, n int64, interval time.Duration, now time.Time) (next time.Time, ok bool, retryAfter time.Duration) {
	t, tau := emission(n, interval)
	at := maxTime(tat, now)
	if ahead := at.Sub(now); ahead > tau {
		return tat, false, ahead - tau
	}
	return at.Add(t), true, 0
}

// RefundRate gives back one execution TakeRate admitted at tat (one that did
// not start after all: a later limit refused it).
func RefundRate(tat time.Time, n int64, interval time.Duration) time.Time {
	t, _ := emission(n, interval)
	return tat.Add(-t)
}

// RescaleRate carries tat, a rate's time under n per interval, to m per
// every: the executions it counts ahead of now stay counted, at most a full
// burst of the new limit. A limit changed while callers wait neither holds
// them for the old interval nor lets the new burst through on top of what
// the old one admitted.
func RescaleRate(tat time.Time, n int64, interval time.Duration, m int64, every time.Duration, now time.Time) time.Time {
	t, _ := emission(n, interval)
	u, _ := emission(m, every)
	if n == m && interval == every || !tat.After(now) || t <= 0 {
		return tat
	}
	ahead := float64(tat.Sub(now)) / float64(t) * float64(u)
	return now.Add(time.Duration(min(ahead, float64(every))))
}

// RateUsed is how many executions of the last interval a rate counts at now:
// a full burst (n) when tat is a whole interval ahead.
func RateUsed(tat time.Time, n int64, interval time.Duration, now time.Time) int64 {
	t, _ := emission(n, interval)
	ahead := tat.Sub(now)
	if ahead <= 0 || t <= 0 {
		return 0
	}
	return min(n, int64(math.Ceil(float64(ahead)/float64(t))))
}

// emission is a rate's interval between executions, and its tolerance (a
// burst of n).
func emission(n int64, interval time.Duration) (t, tau time.Duration) {
	if n <= 0 {
		return interval, -1 // admits nothing
	}
	t = interval / time.Duration(n)
	return t, interval - t
}

// Window is a budget's usage: the sums charged in each granule of time (a
// granule is Granule long, numbered from the Unix epoch), and the executions
// charged lately, so that an execution charged again (its worker lost before
// its attempt started, and the request redelivered) counts once.
type Window struct {
	Granule time.Duration `json:"granule"`
	Sums    []Sum         `json:"sums,omitempty"`
	Charged []Charge      `json:"charged,omitempty"`
}

// Sum is what was charged in one granule.
type Sum struct {
	Granule int64 `json:"g"`
	Amount  int64 `json:"a"`
}

// Charge is one execution's charge, kept for Remember.
type Charge struct {
	Key    string    `json:"key"`
	Amount int64     `json:"a"`
	At     time.Time `json:"at"`
}

// Granules is how many granules a budget's window is cut into: usage is
// counted to a granule's precision, never less than the window holds.
const Granules = 60

// Remembered bounds how many recent charges a budget keeps.
const Remembered = 256

// GranuleOf is the granule a window of length window is counted in: a
// sixtieth of it, at least a second.
func GranuleOf(window time.Duration) time.Duration {
	return max(window/Granules, time.Second)
}

// Used is the usage a window counts at now: every granule that holds any
// instant of the last window, so never less than what was charged in it.
func (w Window) Used(window time.Duration, now time.Time) int64 {
	first := w.first(window, now)
	var used int64
	for _, s := range w.Sums {
		if s.Granule >= first {
			used = addSat(used, s.Amount)
		}
	}
	return used
}

// first is the oldest granule the window counts at now.
func (w Window) first(window time.Duration, now time.Time) int64 {
	return granuleAt(now.Add(-window), w.granule(window))
}

func (w Window) granule(window time.Duration) time.Duration {
	if w.Granule > 0 {
		return w.Granule
	}
	return GranuleOf(window)
}

func granuleAt(t time.Time, g time.Duration) int64 {
	return floorDiv(t.UnixNano(), int64(g))
}

// BudgetDecision is what Charge decided.
type BudgetDecision struct {
	// OK: the execution is charged (or was already: Already).
	OK, Already bool
	// Used is the usage before this charge.
	Used int64
	// RetryAfter: over the maximum, how long until the window has room for
	// the amount (0: never — the amount alone is over the maximum).
	RetryAfter time.Duration
	// Moved: an approved execution whose budget grew since its approver saw
	// it.
	Moved bool
}

// ChargeBudget charges amount for the execution key to w, a budget of max
// over window, at now (limit is its maximum). An execution it charged lately is not charged again.
// approvedAt, when set, is the usage an approval bound: the execution may go
// past max as long as the usage has not grown beyond it since (two
// approvals racing for one budget: the first charged runs; the other finds
// the usage moved). keep is how long charges are remembered.
func ChargeBudget(w Window, limit, amount int64, window time.Duration, key string, approvedAt *int64, keep time.Duration, now time.Time) (Window, BudgetDecision) {
	w.Granule = w.granule(window)
	if slices.ContainsFunc(w.Charged, func(c Charge) bool { return c.Key == key }) {
		return w, BudgetDecision{OK: true, Already: true, Used: w.Used(window, now)}
	}
	used := w.Used(window, now)
	d := BudgetDecision{Used: used}
	switch {
	case approvedAt != nil && used <= *approvedAt:
	case approvedAt != nil:
		d.Moved = true
		return w, d
	case addSat(used, amount) > limit:
		d.RetryAfter = w.roomIn(limit, amount, window, now)
		return w, d
	}
	w = w.prune(window, keep, now)
	g := granuleAt(now, w.Granule)
	if i := slices.IndexFunc(w.Sums, func(s Sum) bool { return s.Granule == g }); i >= 0 {
		w.Sums[i].Amount = addSat(w.Sums[i].Amount, amount)
	} else {
		w.Sums = append(w.Sums, Sum{Granule: g, Amount: amount})
	}
	w.Charged = append(w.Charged, Charge{Key: key, Amount: amount, At: now.UTC()})
	if len(w.Charged) > Remembered {
		w.Charged = w.Charged[len(w.Charged)-Remembered:]
	}
	d.OK = true
	return w, d
}

// RefundBudget takes back key's charge (a later limit refused the
// execution): its amount leaves the granule it was charged in.
func RefundBudget(w Window, key string) Window {
	i := slices.IndexFunc(w.Charged, func(c Charge) bool { return c.Key == key })
	if i < 0 {
		return w
	}
	c := w.Charged[i]
	w.Charged = slices.Delete(slices.Clone(w.Charged), i, i+1)
	g := granuleAt(c.At, w.granule(0))
	w.Sums = slices.Clone(w.Sums)
	if j := slices.IndexFunc(w.Sums, func(s Sum) bool { return s.Granule == g }); j >= 0 {
		w.Sums[j].Amount = max(w.Sums[j].Amount-c.Amount, 0)
	}
	return w
}

// roomIn is how long until the window has room for amount under limit, as
// granules leave it; 0 when the amount alone is over it.
func (w Window) roomIn(limit, amount int64, window time.Duration, now time.Time) time.Duration {
	if amount > limit {
		return 0
	}
	g := w.granule(window)
	first := w.first(window, now)
	sums := slices.Clone(w.Sums)
	slices.SortFunc(sums, func(a, b Sum) int { return int(a.Granule - b.Granule) })
	used := w.Used(window, now)
	for _, s := range sums {
		if s.Granule < first {
			continue
		}
		used -= s.Amount
		if used+amount <= limit {
			// Granule s stops counting once the window's oldest instant is
			// past its end.
			leaves := time.Unix(0, (s.Granule+1)*int64(g)).Add(window)
			return max(leaves.Sub(now), time.Millisecond)
		}
	}
	return time.Millisecond
}

// prune drops the granules the window no longer counts, and the charges
// older than keep.
func (w Window) prune(window, keep time.Duration, now time.Time) Window {
	first := w.first(window, now)
	sums := make([]Sum, 0, len(w.Sums)+1)
	for _, s := range w.Sums {
		if s.Granule >= first && s.Amount > 0 {
			sums = append(sums, s)
		}
	}
	w.Sums = sums
	charged := make([]Charge, 0, len(w.Charged)+1)
	for _, c := range w.Charged {
		if now.Sub(c.At) < keep {
			charged = append(charged, c)
		}
	}
	w.Charged = charged
	return w
}

// WaitFor is how long a request waits before it tries a limit again:
// retryAfter when the limit knows it (a rate, a budget), else a backoff that
// doubles with the request's deliveries, from 100 ms to 2 s; and within
// jitter (0 to 1) a little longer, so that requests waiting together do not
// come back together.
func WaitFor(retryAfter time.Duration, deliveries int, jitter float64) time.Duration {
	d := retryAfter
	if d <= 0 {
		d = 100 * time.Millisecond << min(max(deliveries-1, 0), 5)
		d = min(d, 2*time.Second)
	}
	return d + time.Duration(float64(min(d, time.Second))*jitter/4)
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// addSat adds without overflowing.
func addSat(a, b int64) int64 {
	if b > 0 && a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if (a%b != 0) && ((a < 0) != (b < 0)) {
		q--
	}
	return q
}
