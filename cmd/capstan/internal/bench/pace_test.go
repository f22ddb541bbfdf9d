package bench

import (
	"testing"
	"time"
)

func TestPacer_SpinsOnlyWhenCallsAreFarApart(t *testing.T) {
	if !newPacer(10 * time.Millisecond).spin {
		t.Fatal("calls 10 ms apart (100/s): the pacer does not spin")
	}
	if newPacer(10*spinWindow - 1).spin {
		t.Fatal("calls closer than ten spin windows: the pacer spins")
	}
}

func TestPacer_NeverStartsACallBeforeItIsDue(t *testing.T) {
	for _, interval := range []time.Duration{10 * time.Millisecond, 200 * time.Microsecond} {
		p := newPacer(interval)
		start := time.Now()
		for i := range 20 {
			due := start.Add(time.Duration(i) * interval)
			p.wait(due)
			if now := time.Now(); now.Before(due) {
				t.Fatalf("interval %v, call %d: started %v before it was due", interval, i, due.Sub(now))
			}
		}
	}
}
