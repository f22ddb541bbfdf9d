package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/capstan-dev/capstan/auth"
	"github.com/capstan-dev/capstan/broker"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/demo"
	"github.com/capstan-dev/capstan/internal/natsserver"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// benchFlags shape one run of capstan bench.
type benchFlags struct {
	embedded          bool
	n                 int
	concurrency       int
	rate              string
	batch             int
	capability        string
	payload           int
	workers           int
	workerConcurrency int
	backlog           bool
	noAudit           bool
	auth              bool
	noBaseline        bool
	json              bool
	cpuProfile        string
	memProfile        string
	timeout           time.Duration
}

// benchResult is what a run measured; --json prints it as is.
type benchResult struct {
	Mode              string  `json:"mode"` // closed, open, batch or backlog
	Server            string  `json:"server"`
	Capability        string  `json:"capability"`
	N                 int     `json:"n"`
	Concurrency       int     `json:"concurrency"`
	RatePerSec        float64 `json:"ratePerSec,omitempty"`
	Batch             int     `json:"batch,omitempty"`
	Workers           int     `json:"workers"`
	WorkerConcurrency int     `json:"workerConcurrency"`
	PayloadBytes      int     `json:"payloadBytes"`
	Audit             bool    `json:"audit"`
	// Auth: the server required credentials; the client ran as a producer
	// principal and the workers checked its grants.
	Auth bool `json:"auth"`
	CPUs int  `json:"cpus"`

	Completed        int     `json:"completed"`
	NotCompleted     int     `json:"notCompleted"`
	Errors           int     `json:"errors"`
	ElapsedSec       float64 `json:"elapsedSec"`
	ExecutionsPerSec float64 `json:"executionsPerSec"`
	P50Ms            float64 `json:"p50Ms"`
	P90Ms            float64 `json:"p90Ms"`
	P99Ms            float64 `json:"p99Ms"`
	MaxMs            float64 `json:"maxMs"`
	// CPUPerExecutionUs is this process's CPU time (user and system) per
	// execution: with --embedded it counts the server, the workers and the
	// client, and it depends far less on other load than throughput does.
	CPUPerExecutionUs float64 `json:"cpuPerExecutionUs"`
	// AllocsPerExecution and BytesPerExecution are this process's heap
	// allocations per execution (with --embedded: server, workers, client).
	AllocsPerExecution float64 `json:"allocsPerExecution"`
	BytesPerExecution  float64 `json:"bytesPerExecution"`
	// ServerMsgsPerExecution counts the messages the embedded server received
	// and sent per execution: the broker round trips the design costs.
	ServerMsgsPerExecution float64 `json:"serverMsgsPerExecution,omitempty"`
	// DecilesPerSec is the throughput of each tenth of the envelopes, in the
	// order they arrived (backlog mode: the first tenth ran with the deepest
	// queue).
	DecilesPerSec []float64 `json:"decilesPerSec,omitempty"`

	BaselinePerSec float64 `json:"baselinePerSec"`
	BaselineP50Ms  float64 `json:"baselineP50Ms"`
	BaselineP99Ms  float64 `json:"baselineP99Ms"`
	BaselineMaxMs  float64 `json:"baselineMaxMs"`
	// BaselineCPUPerMsgUs is this process's CPU time per raw message.
	BaselineCPUPerMsgUs float64 `json:"baselineCpuPerMsgUs"`
	// BaselineServerMsgsPerMsg is ServerMsgsPerExecution of the baseline.
	BaselineServerMsgsPerMsg float64 `json:"baselineServerMsgsPerMsg,omitempty"`
	// Ratio is executionsPerSec / baselinePerSec.
	Ratio float64 `json:"ratio"`

	// ConsumersBefore and ConsumersMax count the account's JetStream
	// consumers before the run and the most seen during it.
	ConsumersBefore int `json:"consumersBefore"`
	ConsumersMax    int `json:"consumersMax"`
	// PeakRSSMB is this process's peak resident memory (with --embedded it
	// holds the server and the workers too).
	PeakRSSMB float64 `json:"peakRssMB"`
}

func runBench(args []string) int {
	fs := newFlags("bench", "[--embedded | --nats URL] [--n N] [--concurrency C] [--rate R/s] [--batch B] [--capability ID] [--payload BYTES] [--workers W] [--json]")
	conn := addConnFlags(fs)
	f := &benchFlags{}
	fs.BoolVar(&f.embedded, "embedded", false, "start an embedded server in a temporary store (otherwise connect to --nats)")
	fs.IntVar(&f.n, "n", 10000, "executions to run")
	fs.IntVar(&f.concurrency, "concurrency", 256, "closed loop: calls in flight at once")
	fs.StringVar(&f.rate, "rate", "", "open loop: submit at a fixed `R/s` instead of a closed loop")
	fs.IntVar(&f.batch, "batch", 0, "closed loop: each of the --concurrency callers submits B at once with CallMany")
	fs.StringVar(&f.capability, "capability", "demo.echo", "the capability to call")
	fs.IntVar(&f.payload, "payload", 64, "input size in `bytes` (a string field of this length)")
	fs.IntVar(&f.workers, "workers", 1, "in-process workers (0: rely on workers already serving)")
	fs.IntVar(&f.workerConcurrency, "worker-concurrency", 256, "concurrency of each in-process worker")
	fs.BoolVar(&f.backlog, "backlog", false, "submit all N first, then start the workers and time the drain")
	fs.BoolVar(&f.noAudit, "no-audit", false, "in-process workers publish no audit events (to measure the trail's cost)")
	fs.BoolVar(&f.auth, "auth", false, "with --embedded: the server requires credentials, the client is a producer principal and the workers check its grants (to measure what the checks cost)")
	fs.BoolVar(&f.noBaseline, "no-baseline", false, "skip the raw JetStream baseline")
	fs.BoolVar(&f.json, "json", false, "print the result as one JSON object")
	fs.StringVar(&f.cpuProfile, "cpuprofile", "", "write a CPU profile of the capstan phase to `file`")
	fs.StringVar(&f.memProfile, "memprofile", "", "write an allocation profile at the end of the capstan phase to `file`")
	fs.DurationVar(&f.timeout, "timeout", 10*time.Minute, "give up after this long")
	if _, code, ok := parseFlags(fs, args, 0); !ok {
		return code
	}
	rate, err := parseRate(f.rate)
	if err != nil {
		return usageError("%v", err)
	}
	switch {
	case f.n <= 0:
		return usageError("--n must be positive")
	case f.concurrency <= 0:
		return usageError("--concurrency must be positive")
	case f.payload < 0:
		return usageError("--payload must not be negative")
	case f.workers < 0 || f.workerConcurrency <= 0:
		return usageError("--workers must not be negative and --worker-concurrency must be positive")
	case f.auth && !f.embedded:
		return usageError("--auth needs --embedded (against a server of yours, give --creds)")
	case f.embedded && conn.url != "":
		return usageError("--embedded and --nats exclude each other")
	case f.embedded && f.workers == 0:
		return usageError("--embedded needs --workers of at least 1")
	case rate > 0 && (f.batch > 0 || f.backlog):
		return usageError("--rate excludes --batch and --backlog")
	}

	ctx, stop := signalContext()
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()

	res, err := bench(ctx, f, conn, rate)
	var setup setupError
	if errors.As(err, &setup) {
		return usageError("bench: %v", setup.err)
	}
	if err != nil {
		return fail(exitFailed, "bench: %v", err)
	}
	if f.json {
		if code := printJSON(res); code != exitOK {
			return code
		}
	} else {
		printBench(os.Stdout, res)
	}
	if res.NotCompleted > 0 || res.Errors > 0 {
		return exitFailed
	}
	return exitOK
}

// setupError is a server, connection or provisioning failure before the run:
// exit code 2, as for any connection error.
type setupError struct{ err error }

func (e setupError) Error() string { return e.err.Error() }

// parseRate reads "5000" or "5000/s".
func parseRate(s string) (float64, error) {
	if s == "" {
		return 0, nil
	}
	r, err := strconv.ParseFloat(strings.TrimSuffix(s, "/s"), 64)
	if err != nil || r <= 0 {
		return 0, fmt.Errorf("--rate %q: want a positive number per second, e.g. 5000/s", s)
	}
	return r, nil
}

// benchRig is the server, workers and client one run uses.
type benchRig struct {
	url    string
	srv    *server.Server // nil unless embedded
	client *executor.Client
	b      *broker.Broker
	nc     *nats.Conn
	// adminJS administers streams (the baseline's, the consumer count): the
	// client's own when it may, the admin's with --auth.
	adminJS jetstream.JetStream
	closers []func()
	// startWorkers starts the in-process workers, waits until the catalog
	// lists what they serve, and returns what stops them.
	startWorkers func() (stop func(), err error)
}

func (r *benchRig) close() {
	for i := len(r.closers) - 1; i >= 0; i-- {
		r.closers[i]()
	}
}

func bench(ctx context.Context, f *benchFlags, conn *connFlags, rate float64) (*benchResult, error) {
	rig, err := newBenchRig(ctx, f, conn)
	if err != nil {
		return nil, setupError{err}
	}
	defer rig.close()

	res := &benchResult{
		Mode: "closed", Server: rig.url, Capability: f.capability, N: f.n, Concurrency: f.concurrency,
		Workers: f.workers, WorkerConcurrency: f.workerConcurrency, PayloadBytes: f.payload, Audit: !f.noAudit, Auth: f.auth,
		CPUs: runtime.GOMAXPROCS(0),
	}
	switch {
	case f.embedded:
		res.Server = "embedded"
	case f.workers == 0:
		res.WorkerConcurrency = 0
	}
	input := envelope.MustRaw(map[string]any{"data": strings.Repeat("x", f.payload)})

	// Warm up (connections, pull requests, the catalog, the allocator). A
	// backlog run then stops the workers and queues before starting them again.
	if f.workers > 0 {
		stopWorkers, err := rig.startWorkers()
		if err != nil {
			return nil, err
		}
		warm := benchFlags{n: min(f.n, 500), concurrency: min(f.concurrency, 64), capability: f.capability}
		if _, err := closedLoop(ctx, rig.client, &warm, input, nil); err != nil {
			return nil, fmt.Errorf("warm-up: %w", err)
		}
		if f.backlog {
			stopWorkers()
		}
	}

	consumers := watchConsumers(ctx, rig.adminJS)
	res.ConsumersBefore = consumers.before
	stopProfile, err := startProfile(f.cpuProfile)
	if err != nil {
		return nil, err
	}
	bar := newProgress(f.n, "capstan", f.json)
	cpu0, mem0, msgs0 := cpuTime(), memStats(), rig.serverMsgs()
	var run *loopResult
	switch {
	case f.backlog:
		res.Mode = "backlog"
		run, err = backlogRun(ctx, rig, f, input, bar)
	case rate > 0:
		res.Mode, res.RatePerSec = "open", rate
		run, err = openLoop(ctx, rig.client, f, rate, input, bar)
	case f.batch > 0:
		res.Mode, res.Batch = "batch", f.batch
		run, err = batchLoop(ctx, rig.client, f, input, bar)
	default:
		run, err = closedLoop(ctx, rig.client, f, input, bar)
	}
	cpu, mem1, msgs := cpuTime()-cpu0, memStats(), rig.serverMsgs()-msgs0
	bar.done()
	stopProfile()
	if err == nil && f.memProfile != "" {
		err = writeHeapProfile(f.memProfile)
	}
	res.ConsumersMax = consumers.stop()
	if err != nil {
		return nil, err
	}
	res.Completed, res.NotCompleted, res.Errors = run.completed, run.notCompleted, run.errors
	res.ElapsedSec = run.elapsed.Seconds()
	res.ExecutionsPerSec = float64(run.completed+run.notCompleted) / run.elapsed.Seconds()
	res.P50Ms, res.P90Ms, res.P99Ms, res.MaxMs = percentiles(run.latencies)
	res.DecilesPerSec = deciles(run.arrivals)
	res.CPUPerExecutionUs = float64(cpu.Microseconds()) / float64(f.n)
	res.AllocsPerExecution = float64(mem1.Mallocs-mem0.Mallocs) / float64(f.n)
	res.BytesPerExecution = float64(mem1.TotalAlloc-mem0.TotalAlloc) / float64(f.n)
	res.ServerMsgsPerExecution = float64(msgs) / float64(f.n)
	res.PeakRSSMB = peakRSSMB()

	if !f.noBaseline {
		bar := newProgress(f.n, "baseline", f.json)
		cpu0, msgs0 := cpuTime(), rig.serverMsgs()
		base, err := rawBaseline(ctx, rig, f, rate, len(input), bar)
		res.BaselineCPUPerMsgUs = float64((cpuTime() - cpu0).Microseconds()) / float64(f.n)
		res.BaselineServerMsgsPerMsg = float64(rig.serverMsgs()-msgs0) / float64(f.n)
		bar.done()
		if err != nil {
			return nil, fmt.Errorf("raw baseline: %w", err)
		}
		res.BaselinePerSec = float64(f.n) / base.elapsed.Seconds()
		_, _, _, res.BaselineMaxMs = percentiles(base.latencies)
		res.BaselineP50Ms, _, res.BaselineP99Ms, _ = percentiles(base.latencies)
		res.Ratio = res.ExecutionsPerSec / res.BaselinePerSec
	}
	return res, nil
}

// newBenchRig starts (with --embedded) or reaches the server, provisions, and
// prepares the in-process workers and the client, each on its own connection.
func newBenchRig(ctx context.Context, f *benchFlags, conn *connFlags) (*benchRig, error) {
	rig := &benchRig{}
	connect := func(name string) (*nats.Conn, error) { return conn.connect(name) }
	if f.embedded {
		dir, err := os.MkdirTemp("", "capstan-bench-")
		if err != nil {
			return nil, err
		}
		rig.closers = append(rig.closers, func() { _ = os.RemoveAll(dir) })
		opts := natsserver.Options{StoreDir: dir, Port: -1}
		var setup *auth.Setup
		if f.auth {
			if setup, err = auth.Init(filepath.Join(dir, "secrets"), ""); err == nil {
				err = setup.Add(auth.Grant{Principal: "bench", Role: auth.Producer,
					Actors: []string{envelope.ActorService + ":capstan-bench"}, Capabilities: []string{"*"}})
			}
			if err != nil {
				rig.close()
				return nil, err
			}
			opts.ConfigFile = setup.ServerConfigPath()
		}
		e, err := startEmbedded(ctx, opts, broker.Config{}, setup, newLogger(slog.LevelWarn))
		if err != nil {
			rig.close()
			return nil, err
		}
		rig.closers = append(rig.closers, e.stop)
		rig.url, rig.srv = e.url, e.srv
		connect = func(name string) (*nats.Conn, error) {
			co := broker.ConnectOptions{URL: e.url, Name: "capstan bench " + name}
			if setup != nil {
				co.Creds = setup.CredsPath(auth.WorkerPrincipal)
				if name == "client" {
					co.Creds = setup.CredsPath("bench")
				}
			}
			return broker.Connect(co)
		}
		if setup != nil {
			rig.adminJS = e.b.JS // the embedded server's own connection is the admin's
		}
	}
	nc, err := connect("client")
	if err != nil {
		rig.close()
		return nil, err
	}
	rig.closers = append(rig.closers, nc.Close)
	if rig.url == "" {
		rig.url = nc.ConnectedUrlRedacted()
	}
	rig.nc = nc
	provisioner := nc
	if f.auth {
		// A producer provisions nothing: the workers' connection does.
		if provisioner, err = connect("worker provisioning"); err != nil {
			rig.close()
			return nil, err
		}
		rig.closers = append(rig.closers, provisioner.Close)
	}
	js, err := demo.Provision(ctx, provisioner, 0) // auto: what exists, or the deployment's choice
	if err != nil {
		rig.close()
		return nil, err
	}
	if rig.adminJS == nil {
		rig.adminJS = js
	}

	rig.startWorkers = func() (func(), error) {
		ctx, stop := context.WithCancel(context.Background())
		var running sync.WaitGroup
		stopAll := func() { stop(); running.Wait() }
		for i := 0; i < f.workers; i++ {
			wnc, err := connect(fmt.Sprintf("worker %d", i))
			if err != nil {
				stopAll()
				return nil, err
			}
			reg, err := executor.NewRegistry(demo.Catalog(js)...)
			if err == nil {
				var w *executor.Worker
				w, err = executor.NewWorker(wnc, reg, executor.WorkerConfig{Pool: "default", Concurrency: f.workerConcurrency,
					DisableAudit: f.noAudit, Grace: 5 * time.Second})
				if err == nil {
					running.Add(1)
					go func() {
						defer running.Done()
						defer wnc.Close()
						if err := w.Run(ctx); err != nil {
							fmt.Fprintf(os.Stderr, "capstan bench: worker: %v\n", err)
						}
					}()
				}
			}
			if err != nil {
				wnc.Close()
				stopAll()
				return nil, err
			}
		}
		if _, err := waitServing(ctx, rig.b.Catalog, nil); err != nil {
			stopAll()
			return nil, err
		}
		rig.closers = append(rig.closers, stopAll)
		return stopAll, nil
	}

	rig.client, err = executor.NewClient(nc, executor.ClientConfig{Actor: envelope.Actor{Kind: envelope.ActorService, ID: "capstan-bench"}})
	if err != nil {
		rig.close()
		return nil, err
	}
	rig.closers = append(rig.closers, func() { _ = rig.client.Close() })
	rig.b = rig.client.Broker()
	return rig, nil
}

// loopResult is what one phase measured.
type loopResult struct {
	latencies                       []time.Duration
	arrivals                        []time.Time // when each envelope arrived, in order
	elapsed                         time.Duration
	completed, notCompleted, errors int
}

// tally counts one call's outcome; safe for concurrent use.
type tally struct {
	mu  sync.Mutex
	res loopResult
}

func (t *tally) add(lat time.Duration, env *envelope.Envelope, err error) {
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case err != nil:
		t.res.errors++
		if t.res.errors == 1 {
			fmt.Fprintf(os.Stderr, "capstan bench: first error: %v\n", err)
		}
		return
	case env.Status == envelope.StatusCompleted:
		t.res.completed++
	default:
		t.res.notCompleted++
		if t.res.notCompleted == 1 && env.Error != nil {
			fmt.Fprintf(os.Stderr, "capstan bench: first non-completed envelope: %s %s\n", env.Error.Code, env.Error.Message)
		}
	}
	t.res.latencies = append(t.res.latencies, lat)
	t.res.arrivals = append(t.res.arrivals, now)
}

func (t *tally) result(elapsed time.Duration) *loopResult {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := t.res
	r.elapsed = elapsed
	return &r
}

// closedLoop keeps --concurrency calls in flight until N have returned.
func closedLoop(ctx context.Context, c *executor.Client, f *benchFlags, input envelope.Raw, bar *progress) (*loopResult, error) {
	t := &tally{res: loopResult{latencies: make([]time.Duration, 0, f.n), arrivals: make([]time.Time, 0, f.n)}}
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range min(f.concurrency, f.n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(f.n) && ctx.Err() == nil {
				t0 := time.Now()
				env, err := c.Call(ctx, f.capability, input)
				t.add(time.Since(t0), env, err)
				bar.add(1)
			}
		}()
	}
	wg.Wait()
	return t.result(time.Since(start)), ctx.Err()
}

// batchLoop is the closed loop with CallMany: each caller submits --batch
// requests at once and awaits them all. A call's latency is its batch's.
func batchLoop(ctx context.Context, c *executor.Client, f *benchFlags, input envelope.Raw, bar *progress) (*loopResult, error) {
	t := &tally{res: loopResult{latencies: make([]time.Duration, 0, f.n), arrivals: make([]time.Time, 0, f.n)}}
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range f.concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				end := next.Add(int64(f.batch))
				n := min(int64(f.batch), int64(f.n)-(end-int64(f.batch)))
				if n <= 0 {
					return
				}
				reqs := make([]executor.Request, n)
				for i := range reqs {
					reqs[i] = executor.Request{CapabilityID: f.capability, Input: input}
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
func openLoop(ctx context.Context, c *executor.Client, f *benchFlags, rate float64, input envelope.Raw, bar *progress) (*loopResult, error) {
	t := &tally{res: loopResult{latencies: make([]time.Duration, 0, f.n), arrivals: make([]time.Time, 0, f.n)}}
	interval := time.Duration(float64(time.Second) / rate)
	var wg sync.WaitGroup
	start := time.Now()
	for i := 0; i < f.n && ctx.Err() == nil; i++ {
		due := start.Add(time.Duration(i) * interval)
		if d := time.Until(due); d > 0 {
			time.Sleep(d)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			env, err := c.Call(ctx, f.capability, input)
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
func backlogRun(ctx context.Context, rig *benchRig, f *benchFlags, input envelope.Raw, bar *progress) (*loopResult, error) {
	var mu sync.Mutex
	submitted := make(map[string]time.Time, f.n)
	t := &tally{res: loopResult{latencies: make([]time.Duration, 0, f.n), arrivals: make([]time.Time, 0, f.n)}}
	all := make(chan struct{})
	var seen int
	sub, err := rig.nc.Subscribe(rig.b.Names.EnvelopeSubjectsOf(rig.client.Principal()), func(m *nats.Msg) {
		_, id, _ := broker.ParseKey(rig.b.Names.EnvelopeKeyFromSubject(m.Subject))
		env, err := envelope.DecodeEnvelope(m.Data)
		mu.Lock()
		at, ok := submitted[id]
		delete(submitted, id)
		if ok {
			seen++
		}
		last := seen == f.n
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

	fmt.Fprintf(os.Stderr, "capstan bench: queueing %d requests\n", f.n)
	ids := make(chan int)
	var wg sync.WaitGroup
	var submitErr atomic.Value
	for range f.concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range ids {
				id := envelope.NewExecutionID()
				mu.Lock()
				submitted[id] = time.Now()
				mu.Unlock()
				if _, err := rig.client.Submit(ctx, f.capability, input, executor.WithID(id)); err != nil {
					submitErr.Store(err)
				}
			}
		}()
	}
	for i := 0; i < f.n && ctx.Err() == nil; i++ {
		ids <- i
	}
	close(ids)
	wg.Wait()
	if err, _ := submitErr.Load().(error); err != nil {
		return nil, fmt.Errorf("queue: %w", err)
	}
	fmt.Fprintf(os.Stderr, "capstan bench: %d requests queued; waiting for the workers\n", f.n)
	if f.workers > 0 {
		if _, err := rig.startWorkers(); err != nil {
			return nil, err
		}
	}
	select {
	case <-all:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	r := t.result(0)
	r.elapsed = r.arrivals[len(r.arrivals)-1].Sub(r.arrivals[0])
	return r, nil
}

// rawBaseline runs the same workload on JetStream alone, on the same server:
// publish (acknowledged), pull, ack, with the same payload and the same
// closed-loop concurrency or rate. A message's latency runs from its publish
// to its delivery to the consumer.
func rawBaseline(ctx context.Context, rig *benchRig, f *benchFlags, rate float64, payload int, bar *progress) (*loopResult, error) {
	js := rig.adminJS
	name := rig.b.Names.ExecStream() + "_BENCH_RAW"
	subject := strings.ToLower(name)
	s, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name: name, Subjects: []string{subject}, Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage,
	})
	if err != nil {
		return nil, err
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = js.DeleteStream(dctx, name)
	}()
	cons, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable: "raw", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: max(4*f.concurrency, 1000),
	})
	if err != nil {
		return nil, err
	}

	// Each message carries its publisher's slot and its publish time; the
	// consumer hands the slot back, closing the loop.
	slots := max(f.concurrency, 1)
	done := make([]chan struct{}, slots)
	for i := range done {
		done[i] = make(chan struct{}, 1)
	}
	t := &tally{res: loopResult{latencies: make([]time.Duration, 0, f.n)}}
	var got atomic.Int64
	all := make(chan struct{})
	ok := &envelope.Envelope{Status: envelope.StatusCompleted}
	consumeCtx, err := cons.Consume(func(m jetstream.Msg) {
		d := m.Data()
		slot := binary.BigEndian.Uint32(d[0:4])
		sent := time.Unix(0, int64(binary.BigEndian.Uint64(d[4:12])))
		_ = m.Ack()
		t.add(time.Since(sent), ok, nil)
		bar.add(1)
		if rate == 0 {
			done[slot] <- struct{}{}
		}
		if got.Add(1) == int64(f.n) {
			close(all)
		}
	}, jetstream.PullMaxMessages(max(f.workers, 1)*f.workerConcurrency))
	if err != nil {
		return nil, err
	}
	defer consumeCtx.Stop()

	publish := func(slot int) error {
		b := make([]byte, max(payload, 12))
		binary.BigEndian.PutUint32(b[0:4], uint32(slot))
		binary.BigEndian.PutUint64(b[4:12], uint64(time.Now().UnixNano()))
		_, err := js.Publish(ctx, subject, b)
		return err
	}
	var pubErr atomic.Value
	start := time.Now()
	switch {
	case rate > 0:
		interval := time.Duration(float64(time.Second) / rate)
		for i := 0; i < f.n && ctx.Err() == nil; i++ {
			if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
				time.Sleep(d)
			}
			go func() {
				if err := publish(0); err != nil {
					pubErr.Store(err)
				}
			}()
		}
	default:
		var next atomic.Int64
		var wg sync.WaitGroup
		for slot := range min(slots, f.n) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for next.Add(1) <= int64(f.n) && ctx.Err() == nil {
					if err := publish(slot); err != nil {
						pubErr.Store(err)
						return
					}
					select {
					case <-done[slot]:
					case <-ctx.Done():
						return
					}
				}
			}()
		}
		wg.Wait()
	}
	if err, _ := pubErr.Load().(error); err != nil {
		return nil, err
	}
	select {
	case <-all:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return t.result(time.Since(start)), nil
}

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

func (w *consumerWatch) stop() int {
	close(w.stopCh)
	<-w.done
	return int(w.max.Load())
}

func startProfile(path string) (func(), error) {
	if path == "" {
		return func() {}, nil
	}
	out, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(out); err != nil {
		_ = out.Close()
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	return func() { pprof.StopCPUProfile(); _ = out.Close() }, nil
}

func writeHeapProfile(path string) error {
	out, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("--memprofile: %w", err)
	}
	defer out.Close()
	return pprof.Lookup("allocs").WriteTo(out, 0)
}

// percentiles returns p50, p90, p99 and max in milliseconds.
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

// deciles returns the throughput of each tenth of the arrivals.
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

// serverMsgs counts the messages the embedded server received and sent; 0
// without one.
func (r *benchRig) serverMsgs() int64 {
	if r.srv == nil {
		return 0
	}
	v, err := r.srv.Varz(nil)
	if err != nil {
		return 0
	}
	return v.InMsgs + v.OutMsgs
}

// cpuTime is the CPU time this process used so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// peakRSSMB reads this process's peak resident set (Linux); 0 elsewhere.
func peakRSSMB() float64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			if err == nil {
				return kb / 1024
			}
		}
	}
	return 0
}

func printBench(w io.Writer, r *benchResult) {
	mode := fmt.Sprintf("closed loop, %d in flight", r.Concurrency)
	switch r.Mode {
	case "open":
		mode = fmt.Sprintf("open loop at %.0f/s", r.RatePerSec)
	case "batch":
		mode = fmt.Sprintf("closed loop, %d callers of CallMany(%d)", r.Concurrency, r.Batch)
	case "backlog":
		mode = fmt.Sprintf("backlog of %d drained", r.N)
	}
	audit := "on"
	if !r.Audit {
		audit = "off"
	}
	fmt.Fprintf(w, "capstan bench: %d × %s, %d-byte payload, %s\n", r.N, r.Capability, r.PayloadBytes, mode)
	fmt.Fprintf(w, "server %s; %d worker(s) × %d concurrency; audit %s; %d CPUs\n\n", r.Server, r.Workers, r.WorkerConcurrency, audit, r.CPUs)
	fmt.Fprintf(w, "  executions    %d completed, %d not completed, %d errors in %.2fs\n", r.Completed, r.NotCompleted, r.Errors, r.ElapsedSec)
	fmt.Fprintf(w, "  throughput    %.0f executions/s   (%.0f µs of CPU per execution)\n", r.ExecutionsPerSec, r.CPUPerExecutionUs)
	fmt.Fprintf(w, "  cost          %.0f allocations, %.1f KB allocated, %.1f server messages per execution\n",
		r.AllocsPerExecution, r.BytesPerExecution/1024, r.ServerMsgsPerExecution)
	fmt.Fprintf(w, "  latency       p50 %.2f ms   p90 %.2f ms   p99 %.2f ms   max %.2f ms   (submit → envelope)\n", r.P50Ms, r.P90Ms, r.P99Ms, r.MaxMs)
	if len(r.DecilesPerSec) > 0 {
		parts := make([]string, len(r.DecilesPerSec))
		for i, d := range r.DecilesPerSec {
			parts[i] = strconv.FormatFloat(d, 'f', 0, 64)
		}
		note := ""
		if r.Mode == "backlog" {
			note = " (first tenth: deepest queue)"
		}
		fmt.Fprintf(w, "  by tenths     %s /s%s\n", strings.Join(parts, " "), note)
	}
	fmt.Fprintf(w, "  consumers     %d before, %d at most during the run\n", r.ConsumersBefore, r.ConsumersMax)
	fmt.Fprintf(w, "  peak RSS      %.0f MB (this process)\n", r.PeakRSSMB)
	if r.BaselinePerSec > 0 {
		fmt.Fprintf(w, "\n  raw JetStream %.0f msgs/s   (%.0f µs of CPU per message; publish, pull, ack)\n", r.BaselinePerSec, r.BaselineCPUPerMsgUs)
		fmt.Fprintf(w, "  latency       p50 %.2f ms   p99 %.2f ms   max %.2f ms   (publish → delivery)\n", r.BaselineP50Ms, r.BaselineP99Ms, r.BaselineMaxMs)
		if r.BaselineServerMsgsPerMsg > 0 {
			fmt.Fprintf(w, "  cost          %.1f server messages per message\n", r.BaselineServerMsgsPerMsg)
		}
		fmt.Fprintf(w, "  ratio         %.2f (capstan / raw JetStream)\n", r.Ratio)
	}
}

// progress is a one-line bar on stderr, drawn only when stderr is a terminal.
type progress struct {
	total int
	label string
	n     atomic.Int64
	start time.Time
	stop  chan struct{}
	wg    sync.WaitGroup
}

func newProgress(total int, label string, quiet bool) *progress {
	fi, err := os.Stderr.Stat()
	if quiet || err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		return nil
	}
	p := &progress{total: total, label: label, start: time.Now(), stop: make(chan struct{})}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-p.stop:
				p.draw()
				fmt.Fprintln(os.Stderr)
				return
			case <-t.C:
				p.draw()
			}
		}
	}()
	return p
}

func (p *progress) add(n int) {
	if p != nil {
		p.n.Add(int64(n))
	}
}

func (p *progress) draw() {
	const width = 30
	n := int(p.n.Load())
	filled := min(width, n*width/max(p.total, 1))
	rate := float64(n) / time.Since(p.start).Seconds()
	fmt.Fprintf(os.Stderr, "\r%-9s [%s%s] %d/%d  %.0f/s ", p.label, strings.Repeat("=", filled), strings.Repeat(" ", width-filled), n, p.total, rate)
}

func (p *progress) done() {
	if p != nil {
		close(p.stop)
		p.wg.Wait()
	}
}
