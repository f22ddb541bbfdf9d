package executor_test

import (
	"context"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/internal/testhooks"

	"github.com/capstan-dev/capstan/capstantest"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/procstat"
)

// benchCallMany measures end-to-end throughput of demo.echo executions:
// submitted in batches with CallMany, served by one worker, each awaited to its
// envelope. ns/op is per execution; cpu-µs/exec is the CPU the whole process
// (embedded server included) spent per execution, the steadier figure on a
// shared machine.
func benchCallMany(b *testing.B, cfg executor.WorkerConfig, ls ...executor.Limit) {
	cfg.Concurrency = 256
	echo := echoCap(nil)
	if len(ls) > 0 {
		echo = executor.Define("demo.echo", executor.Meta{Description: "Returns its input.", Expose: executor.On(executor.SurfaceDirect),
			SideEffect: executor.SideEffectNone, Limits: ls},
			func(ctx context.Context, c executor.Call[echoIn]) (echoIn, error) { return c.Input, nil })
	}
	reg, err := executor.NewRegistry(echo)
	if err != nil {
		b.Fatal(err)
	}
	c := capstantest.Worker(b, reg, capstantest.WithConfig(cfg)).Client(b, executor.ClientConfig{Actor: alice})
	callCtx, stop := context.WithTimeout(context.Background(), 10*time.Minute)
	defer stop()
	// Warm up: the worker serves once an execution completes.
	for {
		env, err := c.Call(callCtx, "demo.echo", echoIn{Hello: "warm"})
		if err == nil && env.Status == envelope.StatusCompleted {
			break
		}
		if callCtx.Err() != nil {
			b.Fatal("the worker never served")
		}
		time.Sleep(20 * time.Millisecond)
	}

	const batch = 1000
	reqs := make([]executor.Request, batch)
	for i := range reqs {
		reqs[i] = executor.Request{CapabilityID: "demo.echo", Input: echoIn{Hello: "bench"}}
	}
	b.ReportAllocs()
	b.ResetTimer()
	start, cpu := time.Now(), procstat.CPU()
	for left := b.N; left > 0; left -= batch {
		n := min(left, batch)
		envs, errs := c.CallMany(callCtx, reqs[:n])
		for i := range envs {
			if errs[i] != nil {
				b.Fatal(errs[i])
			}
			if envs[i].Status != envelope.StatusCompleted {
				b.Fatalf("status %s, error %+v", envs[i].Status, envs[i].Error)
			}
		}
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "execs/s")
	if used := procstat.CPU() - cpu; used > 0 {
		b.ReportMetric(float64(used.Microseconds())/float64(b.N), "cpu-µs/exec")
	}
}

func BenchmarkCallMany_AuditOff(b *testing.B) {
	benchCallMany(b, testhooks.Worker(executor.WorkerConfig{}, testhooks.WorkerKnobs{DisableAudit: true}))
}

func BenchmarkCallMany_AuditOn(b *testing.B) {
	benchCallMany(b, executor.WorkerConfig{})
}

func BenchmarkCallMany_AuditStrict(b *testing.B) {
	benchCallMany(b, executor.WorkerConfig{StrictAudit: true})
}

// The cost of limits on the write path (DESIGN §17), every execution on one
// counter of one capability (the hottest case: its compare-and-swaps race):
// a slot (take and release) and a rate per principal, neither ever reached.
func BenchmarkCallMany_LimitSlot(b *testing.B) {
	benchCallMany(b, executor.WorkerConfig{}, executor.Limit{Kind: executor.LimitConcurrency, Max: 1 << 20})
}

func BenchmarkCallMany_LimitRate(b *testing.B) {
	benchCallMany(b, executor.WorkerConfig{}, executor.Limit{Kind: executor.LimitRate, Per: executor.LimitPerPrincipal,
		Max: 1 << 30, Interval: time.Second})
}
