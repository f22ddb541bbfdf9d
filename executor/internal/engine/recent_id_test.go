package engine

import (
	"testing"
	"time"

	"github.com/google/uuid"
)

// idAt is a UUIDv7 whose time is t.
func idAt(t time.Time) string {
	u := uuid.Must(uuid.NewV7())
	ms := uint64(t.UnixMilli())
	for i := range 6 {
		u[i] = byte(ms >> (40 - 8*i))
	}
	return u.String()
}

// An id is recent — any earlier execution of it still has its record, so the
// short path's create is the whole duplicate check (DESIGN §5, §14) — only
// when it is a UUIDv7 made within the record window less the skew a client's
// clock may have, and not further ahead than that skew.
func TestRecentID_WithinTheWindowLessTheSkewOnly(t *testing.T) {
	t.Parallel()
	now := time.Now().Truncate(time.Millisecond)
	for _, window := range []time.Duration{15 * time.Minute, 2 * time.Second} {
		skew := idSkew(window)
		if skew <= 0 || skew >= window {
			t.Fatalf("window %v: skew %v", window, skew)
		}
		tick := skew / 10
		for _, tc := range []struct {
			name string
			id   string
			want bool
		}{
			{"made now", idAt(now), true},
			{"inside the window less the skew", idAt(now.Add(-window + skew + tick)), true},
			{"between the window less the skew and the window", idAt(now.Add(-window + skew - tick)), false},
			{"older than the window", idAt(now.Add(-window - tick)), false},
			{"much older", idAt(now.Add(-100 * window)), false},
			{"ahead by less than the skew", idAt(now.Add(skew - tick)), true},
			{"ahead by more than the skew", idAt(now.Add(skew + tick)), false},
			{"far in the future", idAt(now.Add(100 * window)), false},
			{"not a UUIDv7", uuid.NewString(), false},
			{"not a UUID", "order-42", false},
		} {
			if got := recentID(tc.id, now, window); got != tc.want {
				t.Errorf("window %v, %s: recentID = %v, want %v", window, tc.name, got, tc.want)
			}
		}
	}
}
