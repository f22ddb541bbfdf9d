package engine

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
	t.Parallel()
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
			if got := AbsenceProves(tc.id, tc.stored, tc.first, now, window); got != tc.want {
				t.Errorf("window %v, %s: AbsenceProves = %v, want %v", window, tc.name, got, tc.want)
			}
		}
	}
}
