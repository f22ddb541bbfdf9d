package bench

import (
	"math"
	"testing"
	"time"
)

func TestPercentiles_NearestRankOfTheSortedLatencies(t *testing.T) {
	var lat []time.Duration
	for i := 100; i >= 1; i-- { // unsorted on purpose
		lat = append(lat, time.Duration(i)*time.Millisecond)
	}
	p50, p90, p99, maxMs := percentiles(lat)
	if p50 != 50 || p90 != 90 || p99 != 99 || maxMs != 100 {
		t.Fatalf("got p50 %v p90 %v p99 %v max %v, want 50 90 99 100", p50, p90, p99, maxMs)
	}
	if lat[0] != 100*time.Millisecond {
		t.Fatalf("percentiles sorted its argument in place")
	}
	if a, b, c, d := percentiles(nil); a+b+c+d != 0 {
		t.Fatalf("no latencies: got %v %v %v %v", a, b, c, d)
	}
}

func TestDeciles_ThroughputOfEachTenthOfTheArrivals(t *testing.T) {
	start := time.Unix(0, 0)
	var at []time.Time
	for i := range 100 {
		at = append(at, start.Add(time.Duration(i)*time.Millisecond)) // 1000/s throughout
	}
	d := deciles(at)
	if len(d) != 10 {
		t.Fatalf("got %d deciles, want 10", len(d))
	}
	for i, v := range d {
		if math.Abs(v-1000) > 1e-6 {
			t.Errorf("tenth %d: %v/s, want 1000", i, v)
		}
	}
	if deciles(at[:99]) != nil {
		t.Errorf("fewer than 100 arrivals gave deciles")
	}
}
