package sweeper

import "testing"

// The sweeper tells a request a consumer has delivered from one it has not
// by the consumers' filters and delivered sequences.
func TestEverDelivered_ByFilterAndDeliveredSequence(t *testing.T) {
	t.Parallel()
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
