package delivery

import (
	"testing"
	"time"

	"github.com/google/uuid"
)

// Finding no record proves that no attempt of an execution started only
// while no claim of it could have been made longer ago than the record
// window (DESIGN §5, "What a missing record proves"): when its id is recent,
// or when the message is its id's first publication, delivered for the
// first time or stored within the window. A copy of an older id, or a
// redelivery stored longer ago than the window, proves nothing; the first
// delivery of a request that waited in a backlog longer than the window
// still does.
func TestAbsenceProves_OnlyWhereNoClaimCanHaveExpired(t *testing.T) {
	now := time.Now().Truncate(time.Millisecond)
	for _, window := range []time.Duration{15 * time.Minute, 2 * time.Second} {
		skew := idSkew(window)
		tick := skew / 10
		old := now.Add(-3 * window)
		for _, tc := range []struct {
			name   string
			id     string
			stored time.Time
			first  bool
			want   bool
		}{
			{"a recent id, redelivered", idAt(now), now, false, true},
			{"a recent id, copied", idAt(now.Add(-window / 2)), now, true, true},
			{"an old id's first publication, first delivery (a backlog)", idAt(old), old, true, true},
			{"an old id's first publication, stored within the skew of the id", idAt(old), old.Add(skew - tick), true, true},
			{"an id that is no UUIDv7, redelivered, stored within the window", "order-42", now.Add(-window + skew + tick), false, true},
			{"an old id's first publication, redelivered, stored longer ago than the window", idAt(old), old, false, false},
			{"an old id's copy, first delivery", idAt(old), now, true, false},
			{"an old id's copy, stored just past the skew", idAt(old), old.Add(skew + tick), true, false},
			{"an id that is no UUIDv7, first delivery", uuid.NewString(), old, true, true},
			{"an id that is no UUIDv7, redelivered, stored longer ago than the window", "order-42", old, false, false},
			{"an id that is no UUIDv7, redelivered, stored just longer ago than the window", "order-42", now.Add(-window - tick), false, false},
		} {
			if got := absenceProves(tc.id, tc.stored, tc.first, now, window); got != tc.want {
				t.Errorf("window %v, %s: absenceProves = %v, want %v", window, tc.name, got, tc.want)
			}
		}
	}
}

// The sweeper tells a request a consumer has delivered from one it has not
// by the consumers' filters and delivered sequences.
func TestEverDelivered_ByFilterAndDeliveredSequence(t *testing.T) {
	reach := []consumerReach{
		{filters: []string{"capstan.exec.*.orders.refund", "capstan.exec.*.email.send"}, delivered: 10},
		{filters: []string{"capstan.exec.*._unrouted"}, delivered: 3},
		{filters: []string{"capstan.other.>"}, delivered: 100},
	}
	for _, tc := range []struct {
		subject string
		seq     uint64
		want    bool
	}{
		{"capstan.exec.alice.orders.refund", 10, true},
		{"capstan.exec.alice.orders.refund", 11, false},
		{"capstan.exec.bob.email.send", 2, true},
		{"capstan.exec.bob._unrouted", 3, true},
		{"capstan.exec.bob._unrouted", 4, false},
		{"capstan.exec.alice.demo.echo", 1, false}, // no consumer filters it
		{"capstan.exec.alice.orders.refund.extra", 1, false},
		{"capstan.other.x.y", 50, true},
		{"capstan.other", 50, false}, // > needs at least one token
	} {
		if got := everDelivered(reach, tc.subject, tc.seq); got != tc.want {
			t.Errorf("%s at %d: everDelivered = %v, want %v", tc.subject, tc.seq, got, tc.want)
		}
	}
}
