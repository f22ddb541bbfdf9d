package sweeper

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/internal/broker"
)

// A worker stopped while its sweeper takes the sweeping lease leaves the
// lease free: the write in flight lands before the release reads it, so
// the next worker sweeps at its next pass, not three intervals later.
func TestRun_StoppedWhileTakingTheLease_LeavesItFree(t *testing.T) {
	t.Parallel()
	b, eng := rig(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for round := range 300 {
		s := New(b, eng, Config{Worker: "stopped"})
		runCtx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); s.Run(runCtx, time.Hour) }()
		time.Sleep(time.Duration(rand.IntN(1500)) * time.Microsecond)
		stop()
		<-done
		cur, _, err := broker.Load[lease](ctx, b.Pools, sweeperKey)
		if errors.Is(err, broker.ErrNotFound) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if left := time.Until(cur.Until); left > 0 {
			t.Fatalf("round %d: the stopped sweeper still holds the lease for %v", round, left.Round(time.Second))
		}
	}
}
