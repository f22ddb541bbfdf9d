// Command retained measures what a JetStream server keeps in memory for each
// execution it retains, on an embedded server in this process: it runs
// rounds of N demo.echo executions (a worker and a client on their own
// connections, the audit trail on), and after each round, once the records
// have gone (a short record window) and again once the server's per-block
// state and caches of the round have expired, it prints the server's live
// heap (after a forced collection), its split by the file store's
// structures (from a heap profile), the process's RSS and every stream's
// messages and subjects. From round to round, the growth divided by the
// envelopes added is the memory one retained execution costs.
//
// It also times what a caller does with an old execution: Client.Await and
// Client.Status of the first round's first execution, once every round ran,
// and a get by JetStream alone of the second round's first envelope: each
// first read finds its block no longer in the server's memory.
//
//	go run ./retained -n 100000 -rounds 3
//	go run ./retained -n 50000 -rounds 2 -settle 0   # without waiting for the block state to expire
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/capstan-dev/capstan/benchmarks/internal/heapsplit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/demo"
	"github.com/capstan-dev/capstan/internal/natsserver"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func main() {
	n := flag.Int("n", 100000, "executions per round")
	rounds := flag.Int("rounds", 3, "rounds")
	concurrency := flag.Int("concurrency", 256, "calls in flight, and the worker's concurrency")
	recordWindow := flag.Duration("record-window", 5*time.Second, "the worker's record window: records go this long after their last write")
	settle := flag.Duration("settle", 2*time.Minute+15*time.Second, "after a round, wait this long more for the server's per-block state and caches to expire, and measure again (0: don't)")
	flag.StringVar(&profiles, "profiles", "", "write each measurement's heap profile in this `directory` (go tool pprof -base to compare two)")
	flag.Parse()
	runtime.MemProfileRate = 4096
	if err := run(*n, *rounds, *concurrency, *recordWindow, *settle); err != nil {
		fmt.Fprintln(os.Stderr, "retained:", err)
		os.Exit(1)
	}
}

// profiles is where the heap profiles go; "": nowhere.
var profiles string

func run(n, rounds, concurrency int, recordWindow, settle time.Duration) error {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "capstan-retained-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	srv, err := natsserver.Start(natsserver.Options{StoreDir: dir, Port: -1})
	if err != nil {
		return err
	}
	defer func() { srv.Shutdown(); srv.WaitForShutdown() }()
	url := natsserver.ClientURL(srv)
	connect := func(name string) (*nats.Conn, error) {
		return broker.Connect(broker.ConnectOptions{URL: url, Name: "retained " + name})
	}

	anc, err := connect("admin")
	if err != nil {
		return err
	}
	defer anc.Close()
	cfg := broker.Config{RecordWindow: recordWindow}
	b, err := broker.Provision(ctx, anc, cfg)
	if err != nil {
		return err
	}
	js, err := demo.Provision(ctx, anc, 0)
	if err != nil {
		return err
	}
	wnc, err := connect("worker")
	if err != nil {
		return err
	}
	defer wnc.Close()
	reg, err := executor.NewRegistry(demo.Catalog(js)...)
	if err != nil {
		return err
	}
	w, err := executor.NewWorker(wnc, reg, executor.WorkerConfig{Concurrency: concurrency, Deployment: executor.Deployment(cfg), Grace: 5 * time.Second})
	if err != nil {
		return err
	}
	wctx, stopWorker := context.WithCancel(ctx)
	workerDone := make(chan error, 1)
	go func() { workerDone <- w.Run(wctx) }()
	defer func() { stopWorker(); <-workerDone }()
	select {
	case <-w.Ready():
	case err := <-workerDone:
		return fmt.Errorf("worker: %w", err)
	}
	cnc, err := connect("client")
	if err != nil {
		return err
	}
	defer cnc.Close()
	c, err := executor.NewClient(cnc, executor.ClientConfig{Actor: envelope.Actor{Kind: envelope.ActorService, ID: "retained"}})
	if err != nil {
		return err
	}
	defer c.Close()

	fmt.Printf("%d rounds of %d demo.echo executions, %d in flight; record window %v; %d CPUs, load average %s\n",
		rounds, n, concurrency, recordWindow, runtime.NumCPU(), loadavg())
	input := envelope.MustRaw(map[string]any{"data": strings.Repeat("x", 64)})
	var firsts []string
	var prev *sample
	for round := 1; round <= rounds; round++ {
		start := time.Now()
		id, err := runRound(ctx, c, n, concurrency, input)
		if err != nil {
			return fmt.Errorf("round %d: %w", round, err)
		}
		firsts = append(firsts, id)
		fmt.Printf("\nround %d: %d executions in %.1f s; load average %s\n", round, n, time.Since(start).Seconds(), loadavg())
		time.Sleep(recordWindow + 5*time.Second) // the records go, the trail's batches are committed
		s, err := measure(ctx, b.JS, "records gone")
		if err != nil {
			return err
		}
		s.print(prev)
		if settle > 0 {
			time.Sleep(settle)
			s2, err := measure(ctx, b.JS, "block state expired")
			if err != nil {
				return err
			}
			s2.print(prev)
			s = s2
		}
		prev = s
	}
	if err := timeOld(ctx, c, firsts[0]); err != nil {
		return err
	}
	if len(firsts) < 2 {
		return nil
	}
	return timeRaw(ctx, b.JS, b.Names.EnvelopesBucket(), broker.Key("_anon", firsts[1]))
}

// runRound runs n executions with concurrency in flight and returns the
// first one's id.
func runRound(ctx context.Context, c *executor.Client, n, concurrency int, input envelope.Raw) (string, error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	var firstErr atomic.Value
	var first atomic.Value
	for range concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1); i <= int64(n); i = next.Add(1) {
				env, err := c.Call(ctx, "demo.echo", input)
				if err == nil && env.Status != envelope.StatusCompleted {
					err = fmt.Errorf("execution %s ended %s", env.ExecutionID, env.Status)
				}
				if err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
				if i == 1 {
					first.Store(env.ExecutionID)
				}
			}
		}()
	}
	wg.Wait()
	if err, _ := firstErr.Load().(error); err != nil {
		return "", err
	}
	id, _ := first.Load().(string)
	return id, nil
}

// sample is one measurement.
type sample struct {
	when      string
	live      uint64 // heap in use after a forced collection
	rss       uint64
	parts     []string
	partBytes []int64
	streams   map[string]jetstream.StreamState
}

// measured counts the measurements, to name their profiles.
var measured int

func measure(ctx context.Context, js jetstream.JetStream, when string) (*sample, error) {
	s := &sample{when: when, streams: map[string]jetstream.StreamState{}}
	for name := range js.StreamNames(ctx).Name() {
		st, err := js.Stream(ctx, name)
		if err != nil {
			return nil, err
		}
		info, err := st.Info(ctx)
		if err != nil {
			return nil, err
		}
		s.streams[name] = info.State
	}
	runtime.GC()
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	s.live = ms.HeapAlloc
	s.rss = rss()
	var buf bytes.Buffer
	if err := pprof.Lookup("heap").WriteTo(&buf, 0); err != nil {
		return nil, err
	}
	if profiles != "" {
		measured++
		name := filepath.Join(profiles, fmt.Sprintf("heap-%d-%s.pb.gz", measured, strings.ReplaceAll(when, " ", "-")))
		if err := os.WriteFile(name, buf.Bytes(), 0o644); err != nil {
			return nil, err
		}
	}
	var err error
	s.parts, s.partBytes, _, err = heapsplit.Read(&buf)
	return s, err
}

func (s *sample) envelopes() uint64 {
	for name, st := range s.streams {
		if strings.HasPrefix(name, "KV_") && strings.HasSuffix(name, "_ENVELOPES") {
			return st.Msgs
		}
	}
	return 0
}

func (s *sample) print(prev *sample) {
	fmt.Printf("  %s: live heap %.1f MB, RSS %.1f MB (this process: server, worker and client)\n", s.when, mb(int64(s.live)), mb(int64(s.rss)))
	names := make([]string, 0, len(s.streams))
	for name := range s.streams {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		st := s.streams[name]
		if st.Msgs == 0 {
			continue
		}
		fmt.Printf("    %-22s %9d messages %9d subjects %8.1f MB\n", name, st.Msgs, st.NumSubjects, mb(int64(st.Bytes)))
	}
	for i, name := range s.parts {
		fmt.Printf("    %-34s %8.1f MB\n", name, mb(s.partBytes[i]))
	}
	if prev == nil {
		return
	}
	d := float64(s.envelopes()) - float64(prev.envelopes())
	if d <= 0 {
		return
	}
	fmt.Printf("  per envelope added since the last round (%.0f): live heap %.0f B, RSS %.0f B", d,
		(float64(s.live)-float64(prev.live))/d, (float64(s.rss)-float64(prev.rss))/d)
	for i, name := range s.parts {
		fmt.Printf(", %s %.0f B", strings.Fields(name)[0], float64(s.partBytes[i]-prev.partBytes[i])/d)
	}
	fmt.Println()
}

// timeRaw times what JetStream alone does for the same question: a get of
// one key of the envelopes bucket, the second round's first, whose block the
// server no longer holds in memory either (cold); then 20 more.
func timeRaw(ctx context.Context, js jetstream.JetStream, bucket, key string) error {
	kv, err := js.KeyValue(ctx, bucket)
	if err != nil {
		return err
	}
	var gets []time.Duration
	for range 21 {
		t := time.Now()
		if _, err := kv.Get(ctx, key); err != nil {
			return fmt.Errorf("get %s: %w", key, err)
		}
		gets = append(gets, time.Since(t))
	}
	cold := gets[0]
	gets = gets[1:]
	slices.Sort(gets)
	fmt.Printf("JetStream alone, a get of the second round's first envelope: %.2f ms cold, then median %.2f ms, slowest %.2f ms (20)\n",
		ms(cold), ms(gets[10]), ms(gets[19]))
	return nil
}

// timeOld times Client.Await and Client.Status of id, an execution of the
// first round: the first of each reads a block the server no longer holds
// in memory (cold), as a read of a day-old execution does; then 20 more.
func timeOld(ctx context.Context, c *executor.Client, id string) error {
	var awaits, statuses []time.Duration
	for range 21 {
		t := time.Now()
		env, err := c.Await(ctx, id)
		if err != nil {
			return fmt.Errorf("await %s: %w", id, err)
		}
		if env.Status != envelope.StatusCompleted {
			return fmt.Errorf("await %s: %s", id, env.Status)
		}
		awaits = append(awaits, time.Since(t))
		t = time.Now()
		st, err := c.Status(ctx, id)
		if err != nil || st.Envelope == nil {
			return fmt.Errorf("status %s: %v", id, err)
		}
		statuses = append(statuses, time.Since(t))
	}
	coldAwait, coldStatus := awaits[0], statuses[0]
	awaits, statuses = awaits[1:], statuses[1:]
	slices.Sort(awaits)
	slices.Sort(statuses)
	fmt.Printf("\nthe first execution (%s): await %.2f ms cold, then median %.2f ms, slowest %.2f ms; status %.2f ms, then median %.2f ms, slowest %.2f ms (20 each)\n",
		id, ms(coldAwait), ms(awaits[10]), ms(awaits[19]), ms(coldStatus), ms(statuses[10]), ms(statuses[19]))
	return nil
}

func rss() uint64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0
	}
	pages, _ := strconv.ParseUint(f[1], 10, 64)
	return pages * uint64(os.Getpagesize())
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}

func mb(b int64) float64         { return float64(b) / (1 << 20) }
func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
