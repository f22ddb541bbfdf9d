package bench

import (
	"context"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/nats-io/nats.go"
)

// loopResult is what one phase measured.
type loopResult struct {
	latencies []time.Duration
	// waits are the latencies less each envelope's durationMs: how long a
	// call waited before a worker took it (in the queue, for a slot), with
	// its publication and the envelope's way back.
	waits                           []time.Duration
	arrivals                        []time.Time // when each envelope arrived, in order
	elapsed                         time.Duration
	completed, notCompleted, errors int
}

// tally counts the calls' outcomes; safe for concurrent use.
type tally struct {
	notes io.Writer
	mu    sync.Mutex
	res   loopResult
}

func newTally(n int, notes io.Writer) *tally {
	return &tally{notes: notes, res: loopResult{latencies: make([]time.Duration, 0, n), arrivals: make([]time.Time, 0, n)}}
}

func (t *tally) add(lat time.Duration, env *envelope.Envelope, err error) {
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case err != nil:
		t.res.errors++
		if t.res.errors == 1 {
			fmt.Fprintf(t.notes, "capstan bench: first error: %v\n", err)
		}
		return
	case env.Status == envelope.StatusCompleted:
		t.res.completed++
	default:
		t.res.notCompleted++
		if t.res.notCompleted == 1 && env.Error != nil {
			fmt.Fprintf(t.notes, "capstan bench: first non-completed envelope: %s %s\n", env.Error.Code, env.Error.Message)
		}
	}
	t.res.latencies = append(t.res.latencies, lat)
	t.res.waits = append(t.res.waits, max(lat-time.Duration(env.DurationMs)*time.Millisecond, 0))
	t.res.arrivals = append(t.res.arrivals, now)
}

func (t *tally) result(elapsed time.Duration) *loopResult {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := t.res
	r.elapsed = elapsed
	return &r
}

// closedLoop keeps cfg.Concurrency calls in flight until N have returned.
func closedLoop(ctx context.Context, c *executor.Client, cfg *Config, input envelope.Raw, bar *progress) (*loopResult, error) {
	t := newTally(cfg.N, cfg.Notes)
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range min(cfg.Concurrency, cfg.N) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(cfg.N) && ctx.Err() == nil {
				t0 := time.Now()
				env, err := c.Call(ctx, cfg.Capability, input)
				t.add(time.Since(t0), env, err)
				bar.add(1)
			}
		}()
	}
	wg.Wait()
	return t.result(time.Since(start)), ctx.Err()
}

// batchLoop is the closed loop with CallMany: each caller submits cfg.Batch
// requests at once and awaits them all. A call's latency is its batch's.
func batchLoop(ctx context.Context, c *executor.Client, cfg *Config, input envelope.Raw, bar *progress) (*loopResult, error) {
	t := newTally(cfg.N, cfg.Notes)
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range cfg.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				end := next.Add(int64(cfg.Batch))
				n := min(int64(cfg.Batch), int64(cfg.N)-(end-int64(cfg.Batch)))
				if n <= 0 {
					return
				}
				reqs := make([]executor.Request, n)
				for i := range reqs {
					reqs[i] = executor.Request{CapabilityID: cfg.Capability, Input: input}
				}
				t0 := time.Now()
				envs, errs := c.CallMany(ctx, reqs)
				lat := time.Since(t0)
				for i := range envs {
					t.add(lat, envs[i], errs[i])
				}
				bar.add(int(n))
			}
		}()
	}
	wg.Wait()
	return t.result(time.Since(start)), ctx.Err()
}

// openLoop starts calls at a fixed rate, whatever the earlier ones are doing.
// A call's latency counts from when it was due, so a stall is not hidden by
// calls that were never started (coordinated omission).
func openLoop(ctx context.Context, c *executor.Client, cfg *Config, input envelope.Raw, bar *progress) (*loopResult, error) {
	t := newTally(cfg.N, cfg.Notes)
	interval := time.Duration(float64(time.Second) / cfg.Rate)
	pace := newPacer(interval)
	var wg sync.WaitGroup
	start := time.Now()
	for i := 0; i < cfg.N && ctx.Err() == nil; i++ {
		due := start.Add(time.Duration(i) * interval)
		pace.wait(due)
		wg.Add(1)
		go func() {
			defer wg.Done()
			env, err := c.Call(ctx, cfg.Capability, input)
			t.add(time.Since(due), env, err)
			bar.add(1)
		}()
	}
	wg.Wait()
	return t.result(time.Since(start)), ctx.Err()
}

// backlogRun submits all N before any in-process worker runs, then starts
// them and times the drain, from the first envelope to the last. Envelopes are
// counted on one plain subscription, so that counting costs the server nothing.
func backlogRun(ctx context.Context, r *rig, cfg *Config, input envelope.Raw, bar *progress) (*loopResult, error) {
	var mu sync.Mutex
	submitted := make(map[string]time.Time, cfg.N)
	t := newTally(cfg.N, cfg.Notes)
	all := make(chan struct{})
	var seen int
	sub, err := r.nc.Subscribe(r.b.Names.EnvelopeSubjectsOf(r.client.Principal()), func(m *nats.Msg) {
		_, id, _ := broker.ParseKey(r.b.Names.EnvelopeKeyFromSubject(m.Subject))
		env, err := envelope.DecodeEnvelope(m.Data)
		mu.Lock()
		at, ok := submitted[id]
		delete(submitted, id)
		if ok {
			seen++
		}
		last := seen == cfg.N
		mu.Unlock()
		if !ok {
			return
		}
		t.add(time.Since(at), env, err)
		bar.add(1)
		if last {
			close(all)
		}
	})
	if err != nil {
		return nil, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	_ = sub.SetPendingLimits(-1, -1)

	fmt.Fprintf(cfg.Notes, "capstan bench: queueing %d requests\n", cfg.N)
	ids := make(chan int)
	var wg sync.WaitGroup
	var submitErr atomic.Value
	for range cfg.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range ids {
				id := envelope.NewExecutionID()
				mu.Lock()
				submitted[id] = time.Now()
				mu.Unlock()
				if _, err := r.client.Submit(ctx, cfg.Capability, input, executor.WithID(id)); err != nil {
					submitErr.Store(err)
				}
			}
		}()
	}
	for i := 0; i < cfg.N && ctx.Err() == nil; i++ {
		ids <- i
	}
	close(ids)
	wg.Wait()
	if err, _ := submitErr.Load().(error); err != nil {
		return nil, fmt.Errorf("queue: %w", err)
	}
	fmt.Fprintf(cfg.Notes, "capstan bench: %d requests queued; waiting for the workers\n", cfg.N)
	if cfg.Workers > 0 {
		if _, err := r.startWorkers(ctx); err != nil {
			return nil, err
		}
	}
	select {
	case <-all:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	res := t.result(0)
	res.elapsed = res.arrivals[len(res.arrivals)-1].Sub(res.arrivals[0])
	return res, nil
}
