package engine

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/envelope"
)

// The deadlines of DESIGN §13: a request must have started by its startBy
// and at the latest a margin (a tenth of the record TTL, at most an hour)
// before its age reaches the record TTL; past its TTL deadline nothing
// starts or retries it.
func TestDeadlines_StartByAndTheRecordTTLLessItsMargin(t *testing.T) {
	t.Parallel()
	stored := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	early, late := stored.Add(time.Hour), stored.Add(30*24*time.Hour)
	for _, tc := range []struct {
		name        string
		ttl         time.Duration
		startBy     *time.Time
		start, ends time.Time
	}{
		{"7 days: the margin is an hour", 7 * 24 * time.Hour, nil, stored.Add(7*24*time.Hour - time.Hour), stored.Add(7*24*time.Hour - time.Hour)},
		{"4 s: the margin is a tenth", 4 * time.Second, nil, stored.Add(3600 * time.Millisecond), stored.Add(3600 * time.Millisecond)},
		{"10 h: a tenth is the hour", 10 * time.Hour, nil, stored.Add(9 * time.Hour), stored.Add(9 * time.Hour)},
		{"a startBy before the TTL deadline wins", 7 * 24 * time.Hour, &early, early, stored.Add(7*24*time.Hour - time.Hour)},
		{"a startBy after the TTL deadline is cut", 7 * 24 * time.Hour, &late, stored.Add(7*24*time.Hour - time.Hour), stored.Add(7*24*time.Hour - time.Hour)},
	} {
		if got := StartDeadline(stored, tc.startBy, tc.ttl); !got.Equal(tc.start) {
			t.Errorf("%s: start deadline %v, want %v", tc.name, got, tc.start)
		}
		if got := TTLDeadline(stored, tc.ttl); !got.Equal(tc.ends) {
			t.Errorf("%s: TTL deadline %v, want %v", tc.name, got, tc.ends)
		}
	}
}

// A record write carries the record window as its TTL, and, while the
// execution is not finalized, at least what is left of its lease, in whole
// seconds rounded up (DESIGN §16): a record never expires under its own
// live lease.
func TestRecordTTL_WindowOrAtLeastTheLeaseLeft(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name   string
		state  State
		lease  time.Duration // left at now
		window time.Duration
		want   time.Duration
	}{
		{"a lease shorter than the window", StateRunning, 30 * time.Second, 15 * time.Minute, 15 * time.Minute},
		{"a lease longer than the window", StateRunning, 30 * time.Second, time.Second, 31 * time.Second},
		{"a lease with a fraction of a second left", StateClaimed, 2500 * time.Millisecond, time.Second, 3 * time.Second},
		{"a lease that ran out", StateRunning, -time.Second, time.Second, time.Second},
		{"a finalized record, whatever its lease", StateFinalized, time.Hour, time.Second, time.Second},
		{"a lease equal to the window", StateRunning, 2 * time.Second, 2 * time.Second, 2 * time.Second},
	} {
		rec := &Record{State: tc.state, LeaseUntil: now.Add(tc.lease)}
		if got := recordTTL(rec, tc.window, now); got != tc.want {
			t.Errorf("%s: TTL %v, want %v", tc.name, got, tc.want)
		}
	}
}

// Lease arithmetic: an operation on a record is bounded by a quarter of the
// lease (between 250 ms and 10 s), so that a request lost with a server is
// sent again while the lease still holds; a finalization renews the lease
// before its envelope when half of it or less is left.
func TestLease_OperationBoundAndRenewalBeforeTheEnvelope(t *testing.T) {
	t.Parallel()
	for lease, want := range map[time.Duration]time.Duration{
		30 * time.Second: 7500 * time.Millisecond, time.Second: 250 * time.Millisecond,
		100 * time.Millisecond: 250 * time.Millisecond, 10 * time.Minute: 10 * time.Second,
	} {
		if got := opTimeout(lease); got != want {
			t.Errorf("lease %v: operation bound %v, want %v", lease, got, want)
		}
	}
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	const lease = 30 * time.Second
	for left, want := range map[time.Duration]bool{
		lease: false, lease/2 + time.Millisecond: false, lease / 2: true, time.Second: true, -time.Second: true,
	} {
		if got := renewBeforeEnvelope(now.Add(left), now, lease); got != want {
			t.Errorf("%v of a %v lease left: renew %v, want %v", left, lease, got, want)
		}
	}
}

// What a read of an envelope found: an envelope there is the end, whatever
// it holds; a read that failed is unknown, never absent (a takeover on an
// unknown could repeat a finished attempt).
func TestClassifyEnvelope_UnknownIsNotAbsent(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		env  *envelope.Envelope
		err  error
		want EnvelopeRead
	}{
		{nil, nil, EnvelopeAbsent},
		{&envelope.Envelope{Status: envelope.StatusCompleted}, nil, EnvelopePresent},
		{nil, fmt.Errorf("load: %w", envelope.ErrDecode), EnvelopeUndecodable},
		{nil, errors.New("nats: timeout"), EnvelopeUnknown},
	} {
		if got := classifyEnvelope(tc.env, tc.err); got != tc.want {
			t.Errorf("envelope %v, err %v: %v, want %v", tc.env, tc.err, got, tc.want)
		}
	}
}

// A cancel answers from the record it read, and from the envelope only
// when the record does not tell: an execution whose envelope exists has
// ended, whatever its record says (the record is not written after the
// envelope); only an execution still running gets the cancel recorded.
func TestCancelFound_TheEnvelopeEndsItWhateverTheRecordSays(t *testing.T) {
	t.Parallel()
	completed := &envelope.Envelope{Status: envelope.StatusCompleted}
	for _, tc := range []struct {
		name  string
		rec   Record
		env   *envelope.Envelope
		reads bool
		want  *CancelRecorded
	}{
		{"a finalized record", Record{State: StateFinalized, Status: envelope.StatusFailed}, completed, false,
			&CancelRecorded{State: StateFinalized, Finalized: true, Status: envelope.StatusFailed}},
		{"a cancel recorded already", Record{State: StateRunning, CancelRequested: true}, nil, false,
			&CancelRecorded{State: StateRunning}},
		{"a running record beside its envelope", Record{State: StateRunning, Attempt: 1}, completed, true,
			&CancelRecorded{State: StateFinalized, Finalized: true, Status: envelope.StatusCompleted}},
		{"a running record, no envelope: record the cancel", Record{State: StateRunning, Attempt: 1}, nil, true, nil},
		{"a claim, no envelope: record the cancel", Record{State: StateClaimed}, nil, true, nil},
	} {
		read := false
		got := cancelFound(&tc.rec, func() *envelope.Envelope { read = true; return tc.env })
		if read != tc.reads {
			t.Errorf("%s: envelope read %v, want %v", tc.name, read, tc.reads)
		}
		if (got == nil) != (tc.want == nil) || (got != nil && *got != *tc.want) {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

// What a delivery's metadata gives the table: its deadlines, what a
// missing record proves, whether it is a recent id's first delivery; and,
// without metadata, nothing proven and no deadline known.
func TestDeliveryFacts(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	w := Windows{Record: 15 * time.Minute, Recent: 15 * time.Minute, TTL: 7 * 24 * time.Hour}
	recent, old := idAt(now.Add(-time.Minute)), idAt(now.Add(-time.Hour))
	startBy := now.Add(time.Hour)
	for _, tc := range []struct {
		name          string
		d             Delivery
		proves, first bool
		start, ttl    time.Time
	}{
		{"a recent id's first delivery", Delivery{ID: recent, Stored: now.Add(-time.Minute), Deliveries: 1},
			true, true, now.Add(-time.Minute).Add(w.TTL - time.Hour), now.Add(-time.Minute).Add(w.TTL - time.Hour)},
		{"a recent id redelivered", Delivery{ID: recent, Stored: now.Add(-time.Minute), Deliveries: 2},
			true, false, now.Add(-time.Minute).Add(w.TTL - time.Hour), now.Add(-time.Minute).Add(w.TTL - time.Hour)},
		{"an old id's first publication, redelivered long after", Delivery{ID: old, Stored: now.Add(-time.Hour), Deliveries: 3},
			false, false, now.Add(-time.Hour).Add(w.TTL - time.Hour), now.Add(-time.Hour).Add(w.TTL - time.Hour)},
		{"a startBy", Delivery{ID: recent, StartBy: &startBy, Stored: now.Add(-time.Minute), Deliveries: 1},
			true, true, startBy, now.Add(-time.Minute).Add(w.TTL - time.Hour)},
		{"a recent id beyond a shorter recent window", Delivery{ID: idAt(now.Add(-10 * time.Minute)), Stored: now.Add(-10 * time.Minute), Deliveries: 1},
			true, false, now.Add(-10 * time.Minute).Add(w.TTL - time.Hour), now.Add(-10 * time.Minute).Add(w.TTL - time.Hour)},
		{"no metadata", Delivery{ID: recent, StartBy: &startBy}, false, false, time.Time{}, time.Time{}},
	} {
		ww := w
		if tc.name == "a recent id beyond a shorter recent window" {
			ww.Recent = 5 * time.Minute
		}
		f := tc.d.facts(ww, now)
		if f.AbsenceProves != tc.proves || f.FirstRecent != tc.first || !f.StartDeadline.Equal(tc.start) ||
			!f.TTLDeadline.Equal(tc.ttl) || !f.Now.Equal(now) {
			t.Errorf("%s: proves %v first-recent %v start %v ttl %v; want %v %v %v %v", tc.name, f.AbsenceProves, f.FirstRecent,
				f.StartDeadline, f.TTLDeadline, tc.proves, tc.first, tc.start, tc.ttl)
		}
	}
}

// A delivery of a capability the worker lacks but the catalog lists is left
// for a worker that serves it: soon at first, twice as long at each next
// delivery, never longer than the configured most (DESIGN §3).
func TestRolloutDelay_DoublesFromATenthOfASecondToItsMost(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		most       time.Duration
		deliveries int
		want       time.Duration
	}{
		{5 * time.Second, 0, 100 * time.Millisecond}, // no metadata
		{5 * time.Second, 1, 100 * time.Millisecond},
		{5 * time.Second, 2, 200 * time.Millisecond},
		{5 * time.Second, 6, 3200 * time.Millisecond},
		{5 * time.Second, 7, 5 * time.Second},
		{5 * time.Second, 1 << 20, 5 * time.Second},
		{50 * time.Millisecond, 1, 50 * time.Millisecond},
		{time.Hour, 1 << 20, time.Hour},
	} {
		if got := rolloutDelay(tc.most, tc.deliveries); got != tc.want {
			t.Errorf("rolloutDelay(%v, %d) = %v, want %v", tc.most, tc.deliveries, got, tc.want)
		}
	}
}

func TestHoldDelay_GrowsToFiveSecondsWithJitter(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		deliveries int
		jitter     float64
		want       time.Duration
	}{
		{0, 0, 500 * time.Millisecond},
		{1, 0, 500 * time.Millisecond},
		{2, 0, time.Second},
		{4, 0, 4 * time.Second},
		{5, 0, 5 * time.Second},
		{500, 0, 5 * time.Second},
		{1, 1, 625 * time.Millisecond},
		{500, 1, 6250 * time.Millisecond},
	} {
		if got := holdDelay(tt.deliveries, tt.jitter); got != tt.want {
			t.Errorf("holdDelay(%d, %v) = %v, want %v", tt.deliveries, tt.jitter, got, tt.want)
		}
	}
}
