// Command benchmarks runs one workload on capstan, JetStream alone, asynq
// (Redis) and River (PostgreSQL) and prints a table: enqueue N no-op tasks
// from C producers while a pool of C workers works them, and wait until all
// are done.
//
// A task's latency runs from the start of its enqueue to when it is done:
// for capstan, when its envelope (stored, create-only) reaches a
// subscriber; for River, when the client reports the job completed (the
// completion is stored); for asynq, when the handler returns (asynq marks the
// task done right after, in the same goroutine); for JetStream alone, when
// the worker acknowledges the message, or, doing a capstan execution's
// server work (floor.go), when its result reaches a subscriber.
//
// CPU per task is the CPU time of this process (producers, workers, and for
// capstan and JetStream the embedded server) and of the system's own server
// processes (Redis; PostgreSQL's postmaster and backends), from the first
// enqueue to the last task done, divided by the tasks.
//
// run.sh starts Redis and PostgreSQL on loopback and runs this program.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// result is what one system measured.
type result struct {
	System     string  `json:"system"`
	Backend    string  `json:"backend"`
	N          int     `json:"n"`
	Done       int     `json:"done"`
	ElapsedSec float64 `json:"elapsedSec"`
	PerSec     float64 `json:"perSec"`
	P50Ms      float64 `json:"p50Ms"`
	P99Ms      float64 `json:"p99Ms"`
	// CPUPerTaskUs is the CPU time of the benchmark's process (producers,
	// workers, an embedded server) and of the system's own server processes
	// while the tasks ran, per task.
	CPUPerTaskUs float64 `json:"cpuPerTaskUs"`
}

// workload is what every system runs.
type workload struct {
	n, concurrency int
	payload        []byte
}

func main() {
	n := flag.Int("n", 20000, "tasks")
	concurrency := flag.Int("concurrency", 64, "producers, and workers working at once")
	payload := flag.Int("payload", 64, "task payload in bytes")
	redisAddr := flag.String("redis", "", "Redis host:port for asynq (empty: skip asynq)")
	redisPID := flag.Int("redis-pid", 0, "the Redis server's pid, whose CPU time counts for asynq")
	pgURL := flag.String("pg", "", "PostgreSQL URL for River (empty: skip River)")
	pgPID := flag.Int("pg-pid", 0, "the PostgreSQL postmaster's pid, whose CPU time (and its backends') counts for River")
	raw := flag.Bool("raw", true, "run JetStream alone as a work queue too")
	floor := flag.Bool("floor", true, "run JetStream alone doing the server work of a capstan execution too (a write's, and a read's without claims)")
	rounds := flag.Int("rounds", 2, "run every system this many times, in turn, and keep each one's best round")
	asJSON := flag.Bool("json", false, "print the results as JSON lines")
	flag.Parse()

	wl := workload{n: *n, concurrency: *concurrency, payload: []byte(strings.Repeat("x", *payload))}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()

	type system struct {
		name string
		run  func(context.Context, workload) (*result, error)
	}
	systems := []system{
		{"capstan", func(ctx context.Context, wl workload) (*result, error) { return runCapstan(ctx, wl, false) }},
		{"capstan, a read without claims", func(ctx context.Context, wl workload) (*result, error) { return runCapstan(ctx, wl, true) }},
	}
	if *raw {
		systems = append(systems, system{"raw JetStream", runRaw})
	}
	if *floor {
		systems = append(systems,
			system{"JetStream alone, a capstan execution's server work", func(ctx context.Context, wl workload) (*result, error) { return runFloor(ctx, wl, false) }},
			system{"JetStream alone, a read without claims' server work", func(ctx context.Context, wl workload) (*result, error) { return runFloor(ctx, wl, true) }})
	}
	if *redisAddr != "" {
		systems = append(systems, system{"asynq", func(ctx context.Context, wl workload) (*result, error) {
			return runAsynq(ctx, wl, *redisAddr, *redisPID)
		}})
	}
	if *pgURL != "" {
		systems = append(systems, system{"river", func(ctx context.Context, wl workload) (*result, error) {
			return runRiver(ctx, wl, *pgURL, *pgPID, 0)
		}}, system{"river, fetch cooldown 5ms", func(ctx context.Context, wl workload) (*result, error) {
			return runRiver(ctx, wl, *pgURL, *pgPID, 5*time.Millisecond)
		}})
	}
	// Rounds take the systems in turn, so that a burst of other load on the
	// machine does not fall on one system alone.
	results := make([]*result, len(systems))
	for round := 1; round <= *rounds; round++ {
		for i, s := range systems {
			fmt.Fprintf(os.Stderr, "round %d: %s, %d tasks, concurrency %d\n", round, s.name, wl.n, wl.concurrency)
			r, err := s.run(ctx, wl)
			if err != nil {
				fmt.Fprintf(os.Stderr, "%s: %v\n", s.name, err)
				os.Exit(1)
			}
			fmt.Fprintf(os.Stderr, "  %.0f tasks/s, p50 %.1f ms, p99 %.1f ms, %.0f µs of CPU per task\n", r.PerSec, r.P50Ms, r.P99Ms, r.CPUPerTaskUs)
			settle()
			if results[i] == nil || r.PerSec > results[i].PerSec {
				results[i] = r
			}
		}
	}
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		for _, r := range results {
			_ = enc.Encode(r)
		}
		return
	}
	printTable(os.Stdout, results, wl, *rounds)
}

func printTable(w io.Writer, rs []*result, wl workload, rounds int) {
	fmt.Fprintf(w, "%d no-op tasks, %d producers, %d workers, %d-byte payload; best of %d rounds\n\n",
		wl.n, wl.concurrency, wl.concurrency, len(wl.payload), rounds)
	fmt.Fprintf(w, "| system | backend | tasks/s | p50 ms | p99 ms | CPU per task | capstan ÷ system |\n")
	fmt.Fprintf(w, "|---|---|---:|---:|---:|---:|---:|\n")
	base := rs[0].PerSec
	for _, r := range rs {
		fmt.Fprintf(w, "| %s | %s | %.0f | %.1f | %.1f | %.0f µs | %.2f× |\n", r.System, r.Backend, r.PerSec, r.P50Ms, r.P99Ms,
			r.CPUPerTaskUs, base/r.PerSec)
	}
}

// tracker records each task's enqueue start and completion.
type tracker struct {
	mu      sync.Mutex
	started map[string]time.Time
	lat     []time.Duration
	first   time.Time
	last    time.Time
	done    atomic.Int64
	n       int64
	all     chan struct{}
}

func newTracker(n int) *tracker {
	return &tracker{started: make(map[string]time.Time, n), lat: make([]time.Duration, 0, n), n: int64(n), all: make(chan struct{})}
}

func (t *tracker) start(id string) {
	now := time.Now()
	t.mu.Lock()
	if t.first.IsZero() {
		t.first = now
	}
	t.started[id] = now
	t.mu.Unlock()
}

// finish counts id done; an id never started here (or counted already) is
// ignored.
func (t *tracker) finish(id string) {
	now := time.Now()
	t.mu.Lock()
	at, ok := t.started[id]
	if ok {
		delete(t.started, id)
		t.lat = append(t.lat, now.Sub(at))
		t.last = now
	}
	t.mu.Unlock()
	if ok && t.done.Add(1) == t.n {
		close(t.all)
	}
}

func (t *tracker) wait(ctx context.Context) error {
	select {
	case <-t.all:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%d of %d done: %w", t.done.Load(), t.n, ctx.Err())
	}
}

// result is what t measured of system on backend, with cpuPerTaskUs (see
// measure).
func (t *tracker) result(system, backend string, cpuPerTaskUs float64) *result {
	t.mu.Lock()
	defer t.mu.Unlock()
	lat := slices.Clone(t.lat)
	slices.Sort(lat)
	at := func(p float64) float64 {
		if len(lat) == 0 {
			return 0
		}
		i := max(0, min(len(lat)-1, int(p*float64(len(lat))+0.5)-1))
		return float64(lat[i].Microseconds()) / 1000
	}
	elapsed := t.last.Sub(t.first)
	return &result{System: system, Backend: backend, N: int(t.n), Done: len(lat), ElapsedSec: elapsed.Seconds(),
		PerSec: float64(len(lat)) / elapsed.Seconds(), P50Ms: at(0.50), P99Ms: at(0.99), CPUPerTaskUs: cpuPerTaskUs}
}

// measure enqueues the workload's tasks through enqueue, each started on t,
// waits until all are done and returns the CPU time per task spent
// meanwhile by this process and the processes pids (see meterCPU), in
// microseconds.
func (t *tracker) measure(ctx context.Context, wl workload, newID func() string, enqueue func(ctx context.Context, id string) error, pids ...int) (float64, error) {
	cpu := meterCPU(pids...)
	err := produce(ctx, wl, newID, func(ctx context.Context, id string) error {
		t.start(id)
		return enqueue(ctx, id)
	})
	if err != nil {
		return 0, err
	}
	if err := t.wait(ctx); err != nil {
		return 0, err
	}
	return cpu.perTask(wl.n), nil
}

// produce runs enqueue from wl.concurrency goroutines, n times in all, each
// with a fresh id.
func produce(ctx context.Context, wl workload, newID func() string, enqueue func(ctx context.Context, id string) error) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	var firstErr atomic.Value
	for range wl.concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(wl.n) && ctx.Err() == nil {
				if err := enqueue(ctx, newID()); err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err, _ := firstErr.Load().(error); err != nil {
		return err
	}
	return ctx.Err()
}

func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
}
