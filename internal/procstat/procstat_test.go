package procstat

import "testing"

func TestCPU_GrowsWithWorkWhereMeasured(t *testing.T) {
	before := CPU()
	if before == 0 {
		t.Skip("no CPU reading on this platform")
	}
	x := 0
	for i := range 50_000_000 {
		x += i ^ (x >> 3)
	}
	if after := CPU(); after <= before {
		t.Fatalf("CPU time went from %v to %v over a busy loop (x=%d)", before, after, x)
	}
}
