package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
	"slices"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// consumerWatch samples the account's consumer count during a run.
type consumerWatch struct {
	before int
	max    atomic.Int64
	stopCh chan struct{}
	done   chan struct{}
}

func watchConsumers(ctx context.Context, js jetstream.JetStream) *consumerWatch {
	w := &consumerWatch{before: -1, stopCh: make(chan struct{}), done: make(chan struct{})}
	count := func() int {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		info, err := js.AccountInfo(actx)
		if err != nil {
			return -1
		}
		return info.Consumers
	}
	w.before = count()
	w.max.Store(int64(w.before))
	go func() {
		defer close(w.done)
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-w.stopCh:
				return
			case <-t.C:
				if n := int64(count()); n > w.max.Load() {
					w.max.Store(n)
				}
			}
		}
	}()
	return w
}

// stop ends the sampling and returns the most consumers seen.
func (w *consumerWatch) stop() int {
	close(w.stopCh)
	<-w.done
	return int(w.max.Load())
}

// startProfile starts a CPU profile into cpuPath and an execution trace into
// tracePath, each when its path is set, and returns what stops both.
func startProfile(cpuPath, tracePath string) (func(), error) {
	stopCPU, err := startOne(cpuPath, "CPU profile", pprof.StartCPUProfile, pprof.StopCPUProfile)
	if err != nil {
		return nil, err
	}
	stopTrace, err := startOne(tracePath, "execution trace", trace.Start, trace.Stop)
	if err != nil {
		stopCPU()
		return nil, err
	}
	return func() { stopTrace(); stopCPU() }, nil
}

func startOne(path, what string, start func(io.Writer) error, stop func()) (func(), error) {
	if path == "" {
		return func() {}, nil
	}
	out, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if err := start(out); err != nil {
		_ = out.Close()
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return func() { stop(); _ = out.Close() }, nil
}

func writeHeapProfile(path string) error {
	out, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("memory profile: %w", err)
	}
	defer out.Close()
	return pprof.Lookup("allocs").WriteTo(out, 0)
}

// percentiles returns p50, p90, p99 and max in milliseconds (nearest rank).
func percentiles(lat []time.Duration) (p50, p90, p99, maxMs float64) {
	if len(lat) == 0 {
		return 0, 0, 0, 0
	}
	s := slices.Clone(lat)
	slices.Sort(s)
	at := func(p float64) float64 {
		i := int(p*float64(len(s))+0.5) - 1
		i = max(0, min(i, len(s)-1))
		return ms(s[i])
	}
	return at(0.50), at(0.90), at(0.99), ms(s[len(s)-1])
}

// deciles returns the throughput of each tenth of the arrivals; nil for
// fewer than 100.
func deciles(at []time.Time) []float64 {
	if len(at) < 100 {
		return nil
	}
	out := make([]float64, 0, 10)
	for i := range 10 {
		lo, hi := i*len(at)/10, (i+1)*len(at)/10-1
		d := at[hi].Sub(at[lo]).Seconds()
		if d <= 0 {
			out = append(out, 0)
			continue
		}
		out = append(out, float64(hi-lo)/d)
	}
	return out
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func memStats() runtime.MemStats {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m
}
