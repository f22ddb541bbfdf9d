package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/capstan-dev/capstan/auth"
	"github.com/capstan-dev/capstan/cmd/capstan/internal/bench"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/credfile"
	"github.com/capstan-dev/capstan/internal/natsserver"
	"github.com/capstan-dev/capstan/internal/trail"
)

func runBench(args []string) int {
	fs := newFlags("bench", "[--embedded [--auth] | --nats URL] [--n N] [--concurrency C] [--rate R/s] [--batch B] [--capability ID] [--payload BYTES] [--workers W] [--flood N | --other-backlog N] [--json]")
	conn := addConnFlags(fs)
	var (
		cfg              bench.Config
		embedded, asJSON bool
		withAuth         bool
		checkpoint       bool
		rateFlag         string
		timeout          time.Duration
	)
	fs.BoolVar(&embedded, "embedded", false, "start an embedded server in a temporary store (otherwise connect to --nats)")
	fs.BoolVar(&checkpoint, "checkpoint", false, "with --embedded: an audit checkpointer signs the log every second, in this process, as 'capstan server' does with its key (what it costs)")
	fs.BoolVar(&withAuth, "auth", false, "with --embedded: the server requires credentials, the client is a producer principal and the workers check its grants (what the checks cost)")
	fs.IntVar(&cfg.N, "n", 10000, "executions to run")
	fs.IntVar(&cfg.Concurrency, "concurrency", 256, "closed loop: calls in flight at once")
	fs.StringVar(&rateFlag, "rate", "", "open loop: submit at a fixed `R/s` instead of a closed loop")
	fs.IntVar(&cfg.Batch, "batch", 0, "closed loop: each of the --concurrency callers submits B at once with CallMany")
	fs.StringVar(&cfg.Capability, "capability", "demo.echo", "the capability to call")
	fs.IntVar(&cfg.PayloadBytes, "payload", 64, "input size in `bytes` (a string field of this length)")
	fs.IntVar(&cfg.Workers, "workers", 1, "in-process workers (0: rely on workers already serving)")
	fs.IntVar(&cfg.WorkerConcurrency, "worker-concurrency", 256, "concurrency of each in-process worker")
	fs.BoolVar(&cfg.Backlog, "backlog", false, "submit all N first, then start the workers and time the drain")
	fs.BoolVar(&cfg.NoAudit, "no-audit", false, "in-process workers publish no audit events (to measure the trail's cost)")
	fs.BoolVar(&cfg.AuditUnacked, "audit-unacked", false, "in-process workers publish audit events without JetStream's acknowledgement")
	fs.BoolVar(&cfg.NoBaseline, "no-baseline", false, "skip the raw JetStream baseline")
	fs.BoolVar(&cfg.Floor, "floor", false, "also run an execution's server work on JetStream alone (closed loop): the ceiling of capstan's ratio to raw")
	fs.BoolVar(&asJSON, "json", false, "print the result as one JSON object")
	fs.StringVar(&cfg.CPUProfile, "cpuprofile", "", "write a CPU profile of the capstan phase to `file`")
	fs.StringVar(&cfg.MemProfile, "memprofile", "", "write an allocation profile at the end of the capstan phase to `file`")
	fs.StringVar(&cfg.Trace, "trace", "", "write an execution trace of the capstan phase to `file` (go tool trace)")
	fs.IntVar(&cfg.Flood, "flood", 0, "with --embedded --auth: another principal submits `N` held calls (demo.sleep) as the measured phase starts; the latencies show its fair share")
	fs.IntVar(&cfg.FloodMs, "flood-ms", 900, "how long each flooding call holds its worker slot, in `ms`")
	fs.IntVar(&cfg.OtherBacklog, "other-backlog", 0, "with --embedded --auth: another principal queues `N` demo.echo calls just before the measured phase; the latencies show its fair share of the queue")
	policyFile := fs.String("policy", "", "put this Cedar policy set `file` in force before the run (what deciding every call by it costs)")
	fs.DurationVar(&timeout, "timeout", 10*time.Minute, "give up after this long")
	if _, code, ok := parseFlags(fs, args, 0); !ok {
		return code
	}
	rate, err := parseRate(rateFlag)
	if err != nil {
		return usageError("%v", err)
	}
	cfg.Rate = rate
	if *policyFile != "" {
		if cfg.Policies, err = os.ReadFile(*policyFile); err != nil {
			return usageError("bench: %v", err)
		}
	}
	switch {
	case cfg.N <= 0:
		return usageError("--n must be positive")
	case cfg.Concurrency <= 0:
		return usageError("--concurrency must be positive")
	case cfg.PayloadBytes < 0:
		return usageError("--payload must not be negative")
	case cfg.Workers < 0 || cfg.WorkerConcurrency <= 0:
		return usageError("--workers must not be negative and --worker-concurrency must be positive")
	case cfg.Flood > 0 && !withAuth:
		return usageError("--flood needs --embedded --auth: the flood comes from another principal")
	case checkpoint && !embedded:
		return usageError("--checkpoint needs --embedded (against a server of yours, run 'capstan audit checkpointer')")
	case cfg.OtherBacklog > 0 && !withAuth:
		return usageError("--other-backlog needs --embedded --auth: the backlog is another principal's")
	case withAuth && !embedded:
		return usageError("--auth needs --embedded (against a server of yours, give --creds)")
	case embedded && conn.url != "":
		return usageError("--embedded and --nats exclude each other")
	case embedded && cfg.Workers == 0:
		return usageError("--embedded needs --workers of at least 1")
	case rate > 0 && (cfg.Batch > 0 || cfg.Backlog):
		return usageError("--rate excludes --batch and --backlog")
	}
	cfg.Notes = os.Stderr
	if !asJSON && isTerminal(os.Stderr) {
		cfg.Progress = os.Stderr
	}

	ctx, stop := signalContext()
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	target := bench.Target{Connect: conn.connect}
	if embedded {
		srv, setup, stopServer, err := benchServer(ctx, withAuth)
		if err != nil {
			return usageError("bench: %v", err)
		}
		defer stopServer()
		if checkpoint {
			stopLog, err := benchCheckpointer(srv)
			if err != nil {
				return usageError("bench: %v", err)
			}
			defer stopLog()
		}
		target = bench.Target{Server: srv.srv, Name: "embedded", Auth: withAuth, Connect: func(name string) (*nats.Conn, error) {
			co := broker.ConnectOptions{URL: srv.url, Name: "capstan bench " + name}
			if setup != nil {
				switch {
				case name == "client":
					co.Creds = setup.CredsPath(benchPrincipal)
				case name == "admin":
					co.Creds = setup.CredsPath(auth.AdminPrincipal)
				case name == bench.FloodPrincipal:
					co.Creds = setup.CredsPath(bench.FloodPrincipal)
				default:
					co.Creds = setup.CredsPath(auth.WorkerPrincipal)
				}
			}
			return broker.Connect(co)
		}}
	}
	res, err := bench.Run(ctx, target, cfg)
	if setup := (*bench.SetupError)(nil); errors.As(err, &setup) {
		return usageError("bench: %v", setup.Err)
	}
	if err != nil {
		return fail(exitFailed, "bench: %v", err)
	}
	if asJSON {
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

// benchPrincipal is the producer a bench with --auth calls as.
const benchPrincipal = "bench"

// benchServer starts an embedded server in a temporary store, with the
// resources provisioned; stop removes the store too. With authentication it
// generates a setup there with a producer principal for the client.
func benchServer(ctx context.Context, withAuth bool) (*embedded, *auth.Setup, func(), error) {
	dir, err := os.MkdirTemp("", "capstan-bench-")
	if err != nil {
		return nil, nil, nil, err
	}
	opts := natsserver.Options{StoreDir: filepath.Join(dir, "store"), Port: -1}
	var setup *auth.Setup
	if withAuth {
		if setup, err = auth.Init(filepath.Join(dir, "secrets"), ""); err == nil {
			// The default limits but the payload's: --payload may ask for
			// more than a principal sends by default.
			limits := auth.DefaultLimits
			limits.Payload = -1
			err = setup.Add(auth.Grant{Principal: benchPrincipal, Role: auth.RoleProducer,
				Actors: []string{envelope.ActorService + ":capstan-bench"}, Capabilities: []string{"*"}, Limits: &limits})
			if err == nil {
				// No queue quota: --other-backlog may queue more than a
				// principal may by default.
				quotas := auth.DefaultQuotas
				quotas.QueuedRequests, quotas.QueuedBytes = -1, -1
				err = setup.Add(auth.Grant{Principal: bench.FloodPrincipal, Role: auth.RoleProducer,
					Actors: []string{envelope.ActorService + ":capstan-flood"}, Capabilities: []string{"*"}, Limits: &limits, Quotas: &quotas})
			}
		}
		if err != nil {
			_ = os.RemoveAll(dir)
			return nil, nil, nil, err
		}
		opts.ConfigFile = setup.ServerConfigPath()
		opts.ResolverDir = filepath.Join(opts.StoreDir, credfile.ResolverDirName)
	}
	e, err := startEmbedded(ctx, opts, broker.Config{}, setup, 0, newLogger(slog.LevelWarn))
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, nil, nil, err
	}
	return e, setup, func() { e.stop(); _ = os.RemoveAll(dir) }, nil
}

// isTerminal reports whether f is a character device, where a progress bar
// redrawn in place reads well.
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

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

func printBench(w io.Writer, r *bench.Result) {
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
	if r.Auth {
		audit += "; authentication on"
	}
	if r.OtherBacklog > 0 {
		audit += fmt.Sprintf("; another principal queued %d calls in %.1f s first", r.OtherBacklog, r.OtherBacklogSec)
	}
	if r.Flood > 0 {
		audit += fmt.Sprintf("; another principal flooded %d held calls of %d ms", r.Flood, r.FloodMs)
	}
	if r.PolicyRules > 0 {
		audit += fmt.Sprintf("; every call decided by a Cedar policy set of %d policies", r.PolicyRules)
	}
	fmt.Fprintf(w, "capstan bench: %d × %s, %d-byte payload, %s\n", r.N, r.Capability, r.PayloadBytes, mode)
	fmt.Fprintf(w, "server %s; %d worker(s) × %d concurrency; audit %s; %d CPUs\n\n", r.Server, r.Workers, r.WorkerConcurrency, audit, r.CPUs)
	fmt.Fprintf(w, "  executions    %d completed, %d not completed, %d errors in %.2fs\n", r.Completed, r.NotCompleted, r.Errors, r.ElapsedSec)
	fmt.Fprintf(w, "  throughput    %.0f executions/s   (%.0f µs of CPU per execution)\n", r.ExecutionsPerSec, r.CPUPerExecutionUs)
	fmt.Fprintf(w, "  cost          %.0f allocations, %.1f KB allocated, %.1f server messages per execution\n",
		r.AllocsPerExecution, r.BytesPerExecution/1024, r.ServerMsgsPerExecution)
	fmt.Fprintf(w, "  latency       p50 %.2f ms   p90 %.2f ms   p99 %.2f ms   max %.2f ms   (submit → envelope)\n", r.P50Ms, r.P90Ms, r.P99Ms, r.MaxMs)
	fmt.Fprintf(w, "  waited        p50 %.2f ms   p99 %.2f ms   max %.2f ms   (before a worker took it)\n", r.WaitP50Ms, r.WaitP99Ms, r.WaitMaxMs)
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
	if r.FloorPerSec > 0 {
		fmt.Fprintf(w, "\n  floor         %.0f executions/s   (%.0f µs of CPU, %.1f server messages per execution; an execution's JetStream work alone)\n",
			r.FloorPerSec, r.FloorCPUPerExecutionUs, r.FloorServerMsgsPerExecution)
		fmt.Fprintf(w, "  floor ratio   %.2f (floor / raw JetStream: the most capstan's write path could reach)\n", r.FloorRatio)
	}
}

// benchCheckpointer runs an audit checkpointer on the bench's server with a
// key of its own, as 'capstan server --audit-key' does; stop ends it and
// tells on stderr how far behind the log it ran.
func benchCheckpointer(srv *embedded) (func(), error) {
	dir, err := os.MkdirTemp("", "capstan-bench-key-")
	if err != nil {
		return nil, err
	}
	if _, err := trail.Keygen(dir, "capstan.bench/log"); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	var mu sync.Mutex
	var checkpoints int
	var lags []time.Duration
	c, err := startCheckpointer(srv.b, filepath.Join(dir, trail.KeyFile), trail.Config{Interval: defaultCheckpointInterval,
		Name: "bench", Log: newLogger(slog.LevelWarn),
		OnCheckpoint: func(_ int64, _ int, lag time.Duration) {
			mu.Lock()
			checkpoints++
			lags = append(lags, lag)
			mu.Unlock()
		}}, nil)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return func() {
		c.stop()
		_ = os.RemoveAll(dir)
		mu.Lock()
		defer mu.Unlock()
		slices.Sort(lags)
		if n := len(lags); n > 0 {
			fmt.Fprintf(os.Stderr, "audit log: %d checkpoints signed; lag of the oldest event each covered: p50 %.2fs, max %.2fs\n",
				checkpoints, lags[n/2].Seconds(), lags[n-1].Seconds())
		}
	}, nil
}
