package limits

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"sync"
	"time"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/nats-io/nats.go/jetstream"
)

// Counter is one key of the limits bucket: a limit's definition, as last
// taken, and its usage — the slots' holders, a rate's time, a budget's
// window.
type Counter struct {
	V          int    `json:"v"`
	Kind       Kind   `json:"kind"`
	Capability string `json:"capability"`
	Per        Per    `json:"per,omitempty"`
	Who        string `json:"who,omitempty"`
	Name       string `json:"name,omitempty"`
	Max        int64  `json:"max"`
	IntervalMs int64  `json:"intervalMs,omitempty"`
	// PrincipalMax bounds the slots one principal holds (Limit.PrincipalMax).
	PrincipalMax int64 `json:"principalMax,omitempty"`
	// Holders hold a concurrency limit's slots.
	Holders []Holder `json:"holders,omitempty"`
	// TAT is a rate's theoretical arrival time (TakeRate).
	TAT time.Time `json:"tat,omitzero"`
	// Last is the execution a rate admitted last (its key), at LastAt:
	// taken again within the record window (its worker lost before its
	// attempt started, the request redelivered), it is not counted twice.
	Last   string    `json:"last,omitempty"`
	LastAt time.Time `json:"lastAt,omitzero"`
	// Window is a budget's usage.
	Window    *Window   `json:"window,omitempty"`
	UpdatedAt time.Time `json:"updatedAt"`
}

// Limit is the limit the counter was last taken for.
func (c *Counter) Limit() Limit {
	return Limit{Kind: c.Kind, Capability: c.Capability, Per: c.Per, Who: c.Who, Name: c.Name, Max: c.Max,
		Interval: time.Duration(c.IntervalMs) * time.Millisecond, PrincipalMax: c.PrincipalMax}
}

// Used is the counter's usage at now: slots held, executions of the last
// interval, or the budget's sum over its window.
func (c *Counter) Used(now time.Time) int64 {
	switch c.Kind {
	case Concurrency:
		return int64(len(c.Holders))
	case Rate:
		return RateUsed(c.TAT, c.Max, c.Limit().Interval, now)
	default:
		if c.Window == nil {
			return 0
		}
		return c.Window.Used(c.Limit().Interval, now)
	}
}

func newCounter(l Limit) *Counter {
	c := &Counter{V: envelope.Version, Kind: l.Kind, Capability: l.Capability, Per: l.Per, Who: l.Who, Name: l.Name}
	c.define(l)
	return c
}

// define records l's bound, the one this taking applies.
func (c *Counter) define(l Limit) {
	c.Max, c.IntervalMs, c.PrincipalMax = l.Max, l.Interval.Milliseconds(), l.PrincipalMax
}

// Over is the limit an execution found at its maximum.
type Over struct {
	Limit Limit
	// Used is the usage found.
	Used int64
	// RetryAfter is how long until the limit would let it through, when the
	// limit knows (a rate, a budget; 0: unknown, or never).
	RetryAfter time.Duration
	// PrincipalUsed is set when the execution's principal holds its share
	// of a concurrency limit (Limit.PrincipalMax): the slots it holds.
	PrincipalUsed int64
}

// AliveFunc reads a stale holder's execution record and judges it
// (HolderAlive).
type AliveFunc func(ctx context.Context, h Holder) (Verdict, error)

// Store reads and swaps the counters of the limits bucket, by
// compare-and-swap only. It keeps each key's last value and revision seen,
// so that a worker that alone takes a limit pays one round trip, not two.
type Store struct {
	kv    jetstream.KeyValue
	js    jetstream.JetStream
	alive AliveFunc
	now   func() time.Time
	// keep is how long a budget remembers the executions it charged: the
	// deployment's record window, as long as a record proves anything.
	keep time.Duration

	mu   sync.Mutex
	seen map[string]seenValue
	// keys serializes this store's own changes of one key: executions of
	// one worker never race each other's compare-and-swap, only other
	// workers'.
	keys [64]sync.Mutex
}

type seenValue struct {
	data []byte
	rev  uint64
}

// NewStore is the store of b's limits bucket. alive judges a stale slot
// holder from its execution's record; now is the clock.
func NewStore(b *broker.Broker, alive AliveFunc, now func() time.Time) *Store {
	if now == nil {
		now = time.Now
	}
	return &Store{kv: b.Limits, js: b.JS, alive: alive, now: now, keep: b.Config.RecordWindow, seen: map[string]seenValue{}}
}

// ErrUnavailable reports that the limits bucket did not answer: nothing is
// known to be within its limits, so nothing runs on it (the execution waits).
var ErrUnavailable = errors.New("capstan: the limits bucket did not answer")

// maxTries bounds the compare-and-swaps of one key before the store gives
// up: each failed one means another worker's write landed first, or the
// bucket did not answer.
const maxTries = 50

// Taken is what Take took for one execution: what Release and Undo give
// back.
type Taken struct {
	holder  Holder
	slots   []string    // the slots keys taken
	rates   []takenRate // rates taken (each refunded by Undo)
	budgets []string    // budget keys charged under holder.Key
}

// takenRate is a rate taken, with its key.
type takenRate struct {
	l   Limit
	key string
}

// Slot reports whether a concurrency slot was taken.
func (t Taken) Slot() bool { return len(t.slots) > 0 }

// Take takes, for the execution holder names, every limit of lims, in the
// order rates, concurrency, budgets — or none: at the first limit at its
// maximum it gives back what it took and returns that limit. approved
// holds, by key, the budget usage an approval bound. An error means the
// bucket did not answer (ErrUnavailable), after what was taken was given
// back.
func (s *Store) Take(ctx context.Context, lims []Limit, h Holder, approved map[string]int64) (Taken, *Over, error) {
	t := Taken{holder: h}
	ordered := slices.Clone(lims)
	slices.SortStableFunc(ordered, func(a, b Limit) int { return order(a.Kind) - order(b.Kind) })
	for _, l := range ordered {
		key := l.Key() // a hash for an actor's or principal's counter: once
		var over *Over
		var err error
		switch l.Kind {
		case Rate:
			over, err = s.takeRate(ctx, l, key, h.Key)
			if err == nil && over == nil {
				t.rates = append(t.rates, takenRate{l, key})
			}
		case Concurrency:
			over, err = s.takeSlot(ctx, l, key, h)
			if err == nil && over == nil {
				t.slots = append(t.slots, key)
			}
		case Budget:
			var seen *int64
			if v, ok := approved[key]; ok {
				seen = &v
			}
			over, err = s.charge(ctx, l, key, h.Key, seen)
			if err == nil && over == nil {
				t.budgets = append(t.budgets, key)
			}
		}
		if err != nil || over != nil {
			s.Undo(context.WithoutCancel(ctx), t)
			return Taken{}, over, err
		}
	}
	return t, nil, nil
}

func order(k Kind) int {
	switch k {
	case Rate:
		return 0
	case Concurrency:
		return 1
	}
	return 2
}

// Undo gives back everything t took: an execution that will not start
// after all (a later limit refused it).
func (s *Store) Undo(ctx context.Context, t Taken) {
	s.Release(ctx, t)
	for _, r := range t.rates {
		_, _ = s.change(ctx, r.key, func() *Counter { return newCounter(r.l) }, func(c *Counter) bool {
			if c.TAT.IsZero() {
				return false
			}
			c.TAT = RefundRate(c.TAT, c.Max, c.Limit().Interval)
			if c.Last == t.holder.Key {
				c.Last, c.LastAt = "", time.Time{}
			}
			return true
		})
	}
	for _, key := range t.budgets {
		_, _ = s.change(ctx, key, nil, func(c *Counter) bool {
			if c.Window == nil {
				return false
			}
			w := RefundBudget(*c.Window, t.holder.Key)
			c.Window = &w
			return true
		})
	}
}

// Release gives back the slots t holds, if any: its execution's attempts
// have ended.
func (s *Store) Release(ctx context.Context, t Taken) {
	for _, key := range t.slots {
		_, _ = s.change(ctx, key, nil, func(c *Counter) bool {
			var held bool
			c.Holders, held = ReleaseSlot(c.Holders, t.holder.Claim)
			return held
		})
	}
}

// takeRate takes one execution of a rate for execution, unless the rate
// admitted it last, within the record window: an id used again later (one
// the caller reused past the envelopes' retention) is counted again.
func (s *Store) takeRate(ctx context.Context, l Limit, key, execution string) (*Over, error) {
	var over *Over
	_, err := s.change(ctx, key, func() *Counter { return newCounter(l) }, func(c *Counter) bool {
		over = nil
		if c.Last == execution && s.now().Sub(c.LastAt) < s.keep {
			return false // counted when it was first taken
		}
		c.TAT = RescaleRate(c.TAT, c.Max, c.Limit().Interval, l.Max, l.Interval, s.now()) // the limit may have changed
		c.define(l)
		next, ok, retry := TakeRate(c.TAT, l.Max, l.Interval, s.now())
		if !ok {
			over = &Over{Limit: l, Used: RateUsed(c.TAT, l.Max, l.Interval, s.now()), RetryAfter: retry}
			return false
		}
		c.TAT, c.Last, c.LastAt = next, execution, s.now().UTC()
		return true
	})
	return over, err
}

// takeSlot takes one of a concurrency limit's slots for h. When the slots
// are full and some holder's lease has passed as recorded, each such holder
// is judged from its execution's record, and the bid is made again with the
// verdicts.
func (s *Store) takeSlot(ctx context.Context, l Limit, key string, h Holder) (*Over, error) {
	var over *Over
	verdicts := map[string]Verdict{}
	for round := 0; round < 3; round++ {
		var stale []Holder
		_, err := s.change(ctx, key, func() *Counter { return newCounter(l) }, func(c *Counter) bool {
			over, stale = nil, nil
			c.define(l)
			changed := c.judge(verdicts)
			next, ok, st, mine := TakeSlot(c.Holders, l.Max, l.PrincipalMax, h, s.now())
			if ok {
				c.Holders = next
				return true
			}
			for _, x := range st {
				if _, done := verdicts[x.Claim]; !done {
					stale = append(stale, x)
				}
			}
			over = &Over{Limit: l, Used: int64(len(c.Holders))}
			if l.PrincipalMax > 0 && mine >= l.PrincipalMax {
				over.PrincipalUsed = mine
			}
			// What the records said is written, so that others need not ask.
			return changed
		})
		if err != nil || over == nil || len(stale) == 0 {
			return over, err
		}
		for _, x := range stale {
			v, err := s.alive(ctx, x)
			if err != nil {
				return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
			}
			verdicts[x.Claim] = v
		}
	}
	return over, nil
}

// Sweep judges, in every slots key of the bucket, the holders whose lease
// as recorded has passed, and writes back the verdicts when one is gone
// (takeSlot's, with no taker): a worker that died frees its slots though no
// one asks for them, and a principal's or an actor's slots, once empty,
// leave the bucket (counterTTL). It reports how many holders were gone.
func (s *Store) Sweep(ctx context.Context) (int, error) {
	// One watch reads every slots key's value: no read per key.
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	w, err := s.kv.WatchFiltered(wctx, []string{"c.>", "s.>"}, jetstream.IgnoreDeletes())
	if err != nil {
		return 0, err
	}
	defer func() { _ = w.Stop() }()
	held := map[string]*Counter{}
	for e := range w.Updates() {
		if e == nil {
			break // every value present is read
		}
		c := new(Counter)
		if envelope.Unmarshal(e.Value(), c) == nil && len(c.Holders) > 0 {
			held[e.Key()] = c
		}
	}
	if err := wctx.Err(); err != nil {
		return 0, err
	}
	gone, errs := 0, []error(nil)
	for key, c := range held {
		verdicts, anyGone := map[string]Verdict{}, false
		for _, h := range c.Holders {
			if s.now().Before(h.Until) {
				continue
			}
			v, err := s.alive(ctx, h)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			verdicts[h.Claim], anyGone = v, anyGone || v.Gone
		}
		if !anyGone {
			continue // a long call's slot is not rewritten at each pass
		}
		var dropped int
		_, err = s.change(ctx, key, nil, func(c *Counter) bool {
			dropped = len(c.Holders)
			changed := c.judge(verdicts)
			dropped -= len(c.Holders)
			return changed
		})
		if err != nil {
			errs = append(errs, err)
			continue
		}
		gone += dropped
	}
	return gone, errors.Join(errs...)
}

// judge drops the holders verdicts find gone (Verdicts) and reports
// whether the holders changed.
func (c *Counter) judge(verdicts map[string]Verdict) bool {
	judged := Verdicts(c.Holders, verdicts)
	changed := !slices.EqualFunc(judged, c.Holders, sameHolder)
	c.Holders = judged
	return changed
}

func sameHolder(a, b Holder) bool {
	return a.Key == b.Key && a.Claim == b.Claim && a.Until.Equal(b.Until) && a.Worker == b.Worker
}

// charge charges execution's amount to the budget l, under key.
func (s *Store) charge(ctx context.Context, l Limit, key, execution string, approvedAt *int64) (*Over, error) {
	var over *Over
	_, err := s.change(ctx, key, func() *Counter { return newCounter(l) }, func(c *Counter) bool {
		over = nil
		c.define(l)
		var w Window
		if c.Window != nil {
			w = *c.Window
		}
		next, d := ChargeBudget(w, l.Max, l.Amount, l.Interval, execution, approvedAt, s.keep, s.now())
		if !d.OK {
			over = &Over{Limit: l, Used: d.Used, RetryAfter: d.RetryAfter}
			return false
		}
		c.Window = &next
		return !d.Already
	})
	return over, err
}

// Read reads one counter (nil when there is none).
func (s *Store) Read(ctx context.Context, key string) (*Counter, error) {
	c, _, err := broker.Load[Counter](ctx, s.kv, key)
	if errors.Is(err, broker.ErrNotFound) {
		return nil, nil
	}
	return c, err
}

// change applies apply to the counter under key by compare-and-swap,
// starting from the value last seen (or read), and reading it again when
// another write landed first. fresh makes the counter of a key that holds
// nothing (nil: nothing to change then). apply reports whether to write.
// It returns the counter as written or found.
func (s *Store) change(ctx context.Context, key string, fresh func() *Counter, apply func(c *Counter) bool) (*Counter, error) {
	h := fnv.New32a()
	_, _ = h.Write([]byte(key))
	l := &s.keys[h.Sum32()%uint32(len(s.keys))]
	l.Lock()
	defer l.Unlock()
	var lastErr error
	for try := 0; try < maxTries; try++ {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		c, rev, cached, err := s.current(ctx, key, try > 0)
		switch {
		case errors.Is(err, broker.ErrNotFound):
			if fresh == nil {
				return nil, nil
			}
			c, rev = fresh(), 0
		case err != nil:
			lastErr = err
			time.Sleep(broker.Backoff(try))
			continue
		}
		if !apply(c) {
			if cached {
				// A value remembered may be old: a write it saves is
				// checked by its revision, but a "no" (full, over, nothing
				// to release) must be read again before it is believed.
				continue
			}
			return c, nil
		}
		now := s.now().UTC()
		c.V, c.UpdatedAt = envelope.Version, now
		ttl := counterTTL(c, now)
		// Encoded once: the bytes written are the bytes remembered.
		data, err := envelope.Marshal(c)
		var newRev uint64
		if err == nil {
			wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			if rev == 0 {
				newRev, err = broker.CreateDataTTL(wctx, s.kv, key, data, ttl)
			} else {
				newRev, err = broker.UpdateDataTTL(wctx, s.js, s.kv, key, data, rev, ttl)
			}
			cancel()
		}
		if err == nil {
			s.remember(key, data, newRev)
			return c, nil
		}
		lastErr = err
		s.forget(key)
		if !errors.Is(err, broker.ErrExists) && !errors.Is(err, broker.ErrRevisionMismatch) {
			time.Sleep(broker.Backoff(try))
		}
	}
	return nil, fmt.Errorf("%w: key %s: %w", ErrUnavailable, key, lastErr)
}

// current is the counter under key as last seen (cached), or as read now
// (reread, or nothing seen).
func (s *Store) current(ctx context.Context, key string, reread bool) (c *Counter, rev uint64, cached bool, err error) {
	if !reread {
		s.mu.Lock()
		v, ok := s.seen[key]
		s.mu.Unlock()
		if ok {
			c := new(Counter)
			if err := envelope.Unmarshal(v.data, c); err == nil {
				return c, v.rev, true, nil
			}
		}
	}
	c, rev, err = s.read(ctx, key)
	return c, rev, false, err
}

// read reads the counter under key from the bucket.
func (s *Store) read(ctx context.Context, key string) (*Counter, uint64, error) {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	e, err := s.kv.Get(rctx, key)
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
			s.forget(key)
			return nil, 0, broker.ErrNotFound
		}
		return nil, 0, err
	}
	c := new(Counter)
	if err := envelope.Unmarshal(e.Value(), c); err != nil {
		return nil, 0, fmt.Errorf("capstan: %s/%s: %w", s.kv.Bucket(), key, err)
	}
	s.remember(key, e.Value(), e.Revision())
	return c, e.Revision(), nil
}

// seenKeys bounds the values a store keeps: past it, it starts afresh.
const seenKeys = 10000

func (s *Store) remember(key string, data []byte, rev uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.seen) >= seenKeys {
		clear(s.seen)
	}
	s.seen[key] = seenValue{data: data, rev: rev}
}

func (s *Store) forget(key string) {
	s.mu.Lock()
	delete(s.seen, key)
	s.mu.Unlock()
}

// counterTTL is how long a write of c keeps it unless rewritten: a rate
// until its time has passed and an interval more, a budget a window and a
// granule; a capability's slots for ever (one key per capability), a
// principal's or an actor's for ever while held and a minute once empty,
// so that idle callers leave the bucket (a holder's lease is judged by its
// record, not by time: held slots never expire; Sweep empties those whose
// holders are gone).
func counterTTL(c *Counter, now time.Time) time.Duration {
	interval := c.Limit().Interval
	switch c.Kind {
	case Rate:
		return max(c.TAT.Sub(now), 0).Truncate(time.Second) + interval + 2*time.Second
	case Budget:
		return interval + GranuleOf(interval) + 2*time.Second
	}
	if c.Per != PerCapability && c.Per != "" && len(c.Holders) == 0 {
		return EmptySlotsTTL
	}
	return 0
}

// EmptySlotsTTL is how long a principal's or an actor's slots stay in the
// bucket once no one holds them.
const EmptySlotsTTL = time.Minute
