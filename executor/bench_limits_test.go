package executor_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/capstantest"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
)

// BenchmarkLimits_RateOverAMinute holds a rate of 10 a second, with three
// workers and 64 callers that always want more, for a minute (b.N is not
// used: the figure is the rate kept). It reports the executions started per
// second after the first burst, and its error against the rate in percent.
func BenchmarkLimits_RateOverAMinute(b *testing.B) {
	const rate, window = 10, time.Minute
	var started atomic.Int64
	rated := executor.Define("t.rated", executor.Meta{Description: "Rated.", Expose: executor.On(executor.SurfaceDirect),
		SideEffect: executor.SideEffectRead, Limits: []executor.Limit{{Kind: executor.LimitRate, Max: rate, Interval: time.Second}}},
		func(ctx context.Context, call executor.Call[struct{}]) (string, error) {
			started.Add(1)
			return "ok", nil
		})
	reg, err := executor.NewRegistry(rated)
	if err != nil {
		b.Fatal(err)
	}
	w := capstantest.Worker(b, reg)
	for range 2 {
		capstantest.Worker(b, reg, capstantest.WithConn(w.Connect(b)))
	}
	c := w.Client(b, executor.ClientConfig{Actor: alice})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			for ctx.Err() == nil {
				env, err := c.Call(ctx, "t.rated", struct{}{}, executor.StartWithin(time.Minute))
				if err == nil && env.Status != envelope.StatusCompleted {
					b.Errorf("%+v", env.Error)
					return
				}
			}
		})
	}
	time.Sleep(5 * time.Second) // past the first burst
	from, t0 := started.Load(), time.Now()
	b.ResetTimer()
	time.Sleep(window)
	n, elapsed := started.Load()-from, time.Since(t0)
	b.StopTimer()
	cancel()
	wg.Wait()
	perSec := float64(n) / elapsed.Seconds()
	b.ReportMetric(perSec, "started/s")
	b.ReportMetric(100*(perSec-rate)/rate, "error-%")
}
