package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"strings"
	"time"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/oplog"
	"github.com/capstan-dev/capstan/internal/policies"
	"github.com/capstan-dev/capstan/internal/procstat"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Target is the server a run measures.
type Target struct {
	// Connect opens one connection; name says whose it is ("client",
	// "worker 0", "admin"). Each worker and the client get their own; the
	// admin's provisions the demo's resources, runs the baseline and counts
	// consumers, which a producer's credentials would not allow.
	Connect func(name string) (*nats.Conn, error)
	// Auth reports that the server requires credentials (Result.Auth).
	Auth bool
	// Server is the embedded server, if the run started one: its counters
	// give the server messages per execution. Nil: not counted.
	Server *server.Server
	// Name is what Result.Server reports; empty: the client's URL.
	Name string
}

// Config shapes one run. N, Concurrency, Capability and (with Workers)
// WorkerConcurrency must be set; Rate, Batch and Backlog choose the load.
type Config struct {
	N           int     // executions to run
	Concurrency int     // closed loop: calls in flight; batch: callers
	Rate        float64 // open loop: calls started per second (0: closed loop)
	Batch       int     // closed loop of CallMany calls of this many requests
	Backlog     bool    // queue all N, then start the workers and time the drain
	Capability  string
	// PayloadBytes is the length of the input's one string field.
	PayloadBytes int
	// Workers run in this process, serving the demo capabilities; 0 relies
	// on workers already serving.
	Workers           int
	WorkerConcurrency int
	NoAudit           bool // in-process workers publish no audit events
	AuditUnacked      bool // in-process workers publish audit events without acknowledgement
	NoBaseline        bool // skip the raw JetStream baseline
	// Floor also runs the server work of an execution on JetStream alone,
	// with nothing of capstan's own (closed loop only; see Result.FloorPerSec).
	Floor      bool
	CPUProfile string
	MemProfile string
	// Trace is where an execution trace of the capstan phase is written.
	Trace string
	// Flood, with credentials (Target.Auth), has another producer principal
	// submit this many held calls (demo.sleep of FloodMs) as the measured
	// phase starts: the measured principal's latencies then show whether
	// one principal's backlog stands in front of another's (DESIGN §17).
	Flood   int
	FloodMs int
	// Policies, when set, is a Cedar policy set (DESIGN §18) put in force
	// once the workers serve, before the warm-up: what deciding every call
	// by it costs.
	Policies []byte
	// OtherBacklog, with credentials, has another producer principal queue
	// this many demo.echo calls while the workers are stopped; they start
	// again with the measured phase, whose latencies then show whether one
	// principal's backlog in the queue stands in front of another's calls
	// (DESIGN §3).
	OtherBacklog int
	// Progress, if set, receives a one-line progress bar redrawn in place;
	// give it a terminal only.
	Progress io.Writer
	// Notes receives a line on the first error, on the first envelope that
	// did not complete, and on a backlog's phases; nil discards them.
	Notes io.Writer
}

func (c *Config) validate() error {
	switch {
	case c.N <= 0:
		return errors.New("the number of executions must be positive")
	case c.Concurrency <= 0:
		return errors.New("concurrency must be positive")
	case c.PayloadBytes < 0:
		return errors.New("payload must not be negative")
	case c.Workers < 0 || (c.Workers > 0 && c.WorkerConcurrency <= 0):
		return errors.New("workers must not be negative and worker concurrency must be positive")
	case c.Rate > 0 && (c.Batch > 0 || c.Backlog):
		return errors.New("a rate excludes batches and a backlog")
	case c.Floor && (c.Rate > 0 || c.Batch > 0 || c.Backlog):
		return errors.New("the floor runs in a closed loop only")
	case c.Capability == "":
		return errors.New("no capability")
	case c.Flood < 0 || (c.Flood > 0 && c.FloodMs <= 0):
		return errors.New("a flood needs a positive number of calls and their length")
	case c.OtherBacklog < 0 || (c.OtherBacklog > 0 && c.Backlog):
		return errors.New("another principal's backlog must not be negative, and excludes a backlog of one's own")
	}
	return nil
}

// Result is what a run measured; `capstan bench --json` prints it as is.
type Result struct {
	Mode string `json:"mode"` // closed, open, batch or backlog
	// Flood is the held calls another principal submitted as the measured
	// phase started, each FloodMs long.
	Flood   int `json:"flood,omitempty"`
	FloodMs int `json:"floodMs,omitempty"`
	// OtherBacklog is the demo.echo calls another principal queued just
	// before the measured phase, and OtherBacklogSec how long queueing
	// them took.
	OtherBacklog      int     `json:"otherBacklog,omitempty"`
	OtherBacklogSec   float64 `json:"otherBacklogSec,omitempty"`
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
	// Auth: the server required credentials, the client ran as a producer
	// principal and the workers checked its grants.
	Auth bool `json:"auth"`
	CPUs int  `json:"cpus"`
	// PolicyRules is how many Cedar policies decided every call (0: none
	// in force).
	PolicyRules int `json:"policyRules,omitempty"`

	Completed        int     `json:"completed"`
	NotCompleted     int     `json:"notCompleted"`
	Errors           int     `json:"errors"`
	ElapsedSec       float64 `json:"elapsedSec"`
	ExecutionsPerSec float64 `json:"executionsPerSec"`
	P50Ms            float64 `json:"p50Ms"`
	P90Ms            float64 `json:"p90Ms"`
	P99Ms            float64 `json:"p99Ms"`
	MaxMs            float64 `json:"maxMs"`
	// WaitP50Ms, WaitP99Ms and WaitMaxMs are how long calls waited before a
	// worker took them: each latency less its envelope's durationMs (from
	// the worker taking the delivery to the end), which leaves the queue,
	// the wait for a slot, the publication and the envelope's way back.
	WaitP50Ms float64 `json:"waitP50Ms"`
	WaitP99Ms float64 `json:"waitP99Ms"`
	WaitMaxMs float64 `json:"waitMaxMs"`
	// CPUPerExecutionUs is this process's CPU time (user and system) per
	// execution: with an embedded server it counts the server, the workers
	// and the client, and it depends far less on other load than throughput
	// does. 0 where the platform offers no reading.
	CPUPerExecutionUs float64 `json:"cpuPerExecutionUs"`
	// AllocsPerExecution and BytesPerExecution are this process's heap
	// allocations per execution (embedded: server, workers, client).
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
	// FloorPerSec, with Config.Floor, is the throughput of an execution's
	// server work alone: the request's acknowledged publish, its delivery, a
	// create-only record, a create-only result republished to the caller, an
	// unacknowledged trail message, the ack (four stored messages, ten
	// server messages, three synchronous writes) and nothing of capstan's
	// own. FloorRatio is FloorPerSec / BaselinePerSec: no capstan built on
	// this write path reaches a higher ratio to raw JetStream.
	FloorPerSec                 float64 `json:"floorPerSec,omitempty"`
	FloorCPUPerExecutionUs      float64 `json:"floorCpuPerExecutionUs,omitempty"`
	FloorServerMsgsPerExecution float64 `json:"floorServerMsgsPerExecution,omitempty"`
	FloorRatio                  float64 `json:"floorRatio,omitempty"`

	// ConsumersBefore and ConsumersMax count the account's JetStream
	// consumers before the run and the most seen during it.
	ConsumersBefore int `json:"consumersBefore"`
	ConsumersMax    int `json:"consumersMax"`
	// PeakRSSMB is this process's peak resident memory (with an embedded
	// server it holds the server and the workers too); 0 where the platform
	// offers no reading (internal/procstat).
	PeakRSSMB float64 `json:"peakRssMB"`
}

// SetupError is a failure before the run started: the server, a connection
// or provisioning. `capstan bench` reports it as a connection error.
type SetupError struct{ Err error }

func (e *SetupError) Error() string { return e.Err.Error() }
func (e *SetupError) Unwrap() error { return e.Err }

// Run measures cfg's load against t and, unless cfg.NoBaseline, the raw
// JetStream baseline after it. A run whose calls did not all complete still
// returns its Result: Completed, NotCompleted and Errors say so.
func Run(ctx context.Context, t Target, cfg Config) (*Result, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.Notes == nil {
		cfg.Notes = io.Discard
	}
	r, err := newRig(ctx, t, &cfg)
	if err != nil {
		return nil, &SetupError{err}
	}
	defer r.close(ctx)

	res := &Result{
		Mode: "closed", Server: r.url, Capability: cfg.Capability, N: cfg.N, Concurrency: cfg.Concurrency,
		Workers: cfg.Workers, WorkerConcurrency: cfg.WorkerConcurrency, PayloadBytes: cfg.PayloadBytes, Audit: !cfg.NoAudit,
		Auth: t.Auth, CPUs: runtime.GOMAXPROCS(0),
	}
	if t.Name != "" {
		res.Server = t.Name
	}
	if cfg.Workers == 0 {
		res.WorkerConcurrency = 0
	}
	input := envelope.MustRaw(map[string]any{"data": strings.Repeat("x", cfg.PayloadBytes)})

	// Warm up (connections, pull requests, the catalog, the allocator). A
	// backlog run then stops the workers and queues before starting them
	// again; so does a run with another principal's backlog.
	if cfg.Workers > 0 {
		stopWorkers, err := r.startWorkers(ctx)
		if err != nil {
			return nil, err
		}
		if len(cfg.Policies) > 0 {
			if res.PolicyRules, err = applyPolicies(ctx, r.adminJS, cfg.Policies); err != nil {
				return nil, &SetupError{err}
			}
		}
		warm := Config{N: min(cfg.N, 500), Concurrency: min(cfg.Concurrency, 64), Capability: cfg.Capability, Notes: cfg.Notes}
		if _, err := closedLoop(ctx, r.client, &warm, input, nil); err != nil {
			return nil, fmt.Errorf("warm-up: %w", err)
		}
		if cfg.Backlog || cfg.OtherBacklog > 0 {
			stopWorkers()
		}
	}

	consumers := watchConsumers(ctx, r.adminJS)
	res.ConsumersBefore = consumers.before
	stopProfile, err := startProfile(cfg.CPUProfile, cfg.Trace)
	if err != nil {
		return nil, err
	}
	if cfg.Flood > 0 {
		if !t.Auth {
			return nil, &SetupError{errors.New("a flood needs credentials: another principal sends it")}
		}
		if err := flood(ctx, t, cfg.Flood, cfg.FloodMs); err != nil {
			return nil, fmt.Errorf("flood: %w", err)
		}
		res.Flood, res.FloodMs = cfg.Flood, cfg.FloodMs
	}
	if cfg.OtherBacklog > 0 {
		if !t.Auth {
			return nil, &SetupError{errors.New("another principal's backlog needs credentials: another principal queues it")}
		}
		// Queued while no worker runs: the whole backlog stands in the
		// queue when the workers start, with the measured phase.
		start := time.Now()
		if err := queueBacklog(ctx, t, cfg.OtherBacklog); err != nil {
			return nil, fmt.Errorf("another principal's backlog: %w", err)
		}
		res.OtherBacklog, res.OtherBacklogSec = cfg.OtherBacklog, time.Since(start).Seconds()
		if cfg.Workers > 0 {
			if _, err := r.startWorkers(ctx); err != nil {
				return nil, err
			}
		}
	}
	bar := newProgress(cfg.Progress, cfg.N, "capstan")
	cpu0, mem0, msgs0 := procstat.CPU(), memStats(), r.serverMsgs()
	var run *loopResult
	switch {
	case cfg.Backlog:
		res.Mode = "backlog"
		run, err = backlogRun(ctx, r, &cfg, input, bar)
	case cfg.Rate > 0:
		res.Mode, res.RatePerSec = "open", cfg.Rate
		run, err = openLoop(ctx, r.client, &cfg, input, bar)
	case cfg.Batch > 0:
		res.Mode, res.Batch = "batch", cfg.Batch
		run, err = batchLoop(ctx, r.client, &cfg, input, bar)
	default:
		run, err = closedLoop(ctx, r.client, &cfg, input, bar)
	}
	cpu, mem1, msgs := procstat.CPU()-cpu0, memStats(), r.serverMsgs()-msgs0
	bar.done()
	stopProfile()
	if err == nil && cfg.MemProfile != "" {
		err = writeHeapProfile(cfg.MemProfile)
	}
	res.ConsumersMax = consumers.stop()
	if err != nil {
		return nil, err
	}
	n := float64(cfg.N)
	res.Completed, res.NotCompleted, res.Errors = run.completed, run.notCompleted, run.errors
	res.ElapsedSec = run.elapsed.Seconds()
	res.ExecutionsPerSec = float64(run.completed+run.notCompleted) / run.elapsed.Seconds()
	res.P50Ms, res.P90Ms, res.P99Ms, res.MaxMs = percentiles(run.latencies)
	res.WaitP50Ms, _, res.WaitP99Ms, res.WaitMaxMs = percentiles(run.waits)
	res.DecilesPerSec = deciles(run.arrivals)
	res.CPUPerExecutionUs = float64(cpu.Microseconds()) / n
	res.AllocsPerExecution = float64(mem1.Mallocs-mem0.Mallocs) / n
	res.BytesPerExecution = float64(mem1.TotalAlloc-mem0.TotalAlloc) / n
	res.ServerMsgsPerExecution = float64(msgs) / n
	res.PeakRSSMB = float64(procstat.PeakRSS()) / (1 << 20)

	if !cfg.NoBaseline {
		base, cpuUs, msgs, err := comparison(ctx, r, &cfg, "baseline", len(input), rawBaseline)
		res.BaselineCPUPerMsgUs, res.BaselineServerMsgsPerMsg = cpuUs, msgs
		if err != nil {
			return nil, fmt.Errorf("raw baseline: %w", err)
		}
		res.BaselinePerSec = n / base.elapsed.Seconds()
		res.BaselineP50Ms, _, res.BaselineP99Ms, res.BaselineMaxMs = percentiles(base.latencies)
		res.Ratio = res.ExecutionsPerSec / res.BaselinePerSec
	}
	if cfg.Floor {
		floor, cpuUs, msgs, err := comparison(ctx, r, &cfg, "floor", len(input), floorLoop)
		res.FloorCPUPerExecutionUs, res.FloorServerMsgsPerExecution = cpuUs, msgs
		if err != nil {
			return nil, fmt.Errorf("floor: %w", err)
		}
		res.FloorPerSec = n / floor.elapsed.Seconds()
		if res.BaselinePerSec > 0 {
			res.FloorRatio = res.FloorPerSec / res.BaselinePerSec
		}
	}
	return res, nil
}

// comparison runs one of the loops on JetStream alone (the raw baseline, the
// floor) with its progress bar named name, and gives with its result the
// CPU time (µs) and server messages it cost per call.
func comparison(ctx context.Context, r *rig, cfg *Config, name string, payload int,
	loop func(context.Context, *rig, *Config, int, *progress) (*loopResult, error)) (res *loopResult, cpuUs, msgs float64, err error) {
	n := float64(cfg.N)
	bar := newProgress(cfg.Progress, cfg.N, name)
	cpu0, msgs0 := procstat.CPU(), r.serverMsgs()
	res, err = loop(ctx, r, cfg, payload, bar)
	cpuUs = float64((procstat.CPU() - cpu0).Microseconds()) / n
	msgs = float64(r.serverMsgs()-msgs0) / n
	bar.done()
	return res, cpuUs, msgs, err
}

// applyPolicies puts the Cedar set text in force, validated against the
// catalog the workers wrote, and waits until every worker evaluates it.
func applyPolicies(ctx context.Context, js jetstream.JetStream, text []byte) (int, error) {
	n := broker.NewNames("")
	kv, err := js.KeyValue(ctx, n.CatalogBucket())
	if err != nil {
		return 0, err
	}
	catalog, err := policies.Catalog(ctx, kv)
	if err != nil {
		return 0, err
	}
	ch, err := policies.Apply(ctx, js.Conn(), n, policies.Applying{File: "bench.cedar", Text: text, Catalog: catalog,
		By: broker.PrincipalOf(js.Conn(), n), Operator: "capstan-bench", Reason: "capstan bench --policy"})
	if err != nil {
		return 0, err
	}
	replies, err := oplog.Confirm(ctx, js.Conn(), n, oplog.Policies, ch.Revision, "", 5*time.Second)
	if err != nil {
		return 0, err
	}
	for _, r := range replies {
		if r.PolicyVersion != ch.Current.Version {
			return 0, fmt.Errorf("worker %s evaluates policy set v%d, not v%d", r.Worker, r.PolicyVersion, ch.Current.Version)
		}
	}
	return ch.Version.Rules, nil
}
