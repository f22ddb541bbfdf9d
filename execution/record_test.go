package execution

import (
	"testing"
	"time"
)

// Leased: a live lease is a claim's (a record naming a worker or a claim
// token) whose lease has not run out; a cancel's pending record names none.
func TestLeased_OnlyAClaimsLeaseNotRunOut(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name string
		rec  Record
		want bool
	}{
		{"a claim with a lease ahead", Record{Worker: "w1", Claim: "c1", LeaseUntil: now.Add(time.Second)}, true},
		{"a claim token alone", Record{Claim: "c1", LeaseUntil: now.Add(time.Second)}, true},
		{"a worker id alone (an earlier version's record)", Record{Worker: "w1", LeaseUntil: now.Add(time.Second)}, true},
		{"a lease that ends now", Record{Worker: "w1", Claim: "c1", LeaseUntil: now}, false},
		{"a lease that ran out", Record{Worker: "w1", Claim: "c1", LeaseUntil: now.Add(-time.Second)}, false},
		{"a pending record naming no claim", Record{State: StatePending, LeaseUntil: now.Add(time.Hour)}, false},
	} {
		if got := tc.rec.Leased(now); got != tc.want {
			t.Errorf("%s: leased %v, want %v", tc.name, got, tc.want)
		}
	}
}
