//go:build unix

package chaos

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/execution"
	"github.com/capstan-dev/capstan/internal/testhooks"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/demo"
	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// proc is one child process: the server or a worker.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
}

// kill sends SIGKILL and waits until the process is gone.
func (p *proc) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// rig is one server process and its worker processes.
type rig struct {
	t           *testing.T
	dir         string
	store       string
	port        int
	url         string
	lease       time.Duration
	concurrency int
	// spec is how startWorker, and so chaos, starts a worker.
	spec workerSpec
	// workerEnv is added to every worker's environment; with it, workers
	// run the test binary (its own worker role), whatever the binary.
	workerEnv []string

	mu      sync.Mutex
	server  *proc
	workers []*proc
	started int
	kills   int
	// killed names the workers killed, aimed the kills that went for the
	// worker of an execution in flight.
	killed []string
	aimed  int
	seed   uint64
	rng    *rand.Rand
}

func newRig(t *testing.T, lease time.Duration, concurrency int) *rig {
	t.Helper()
	dir := t.TempDir()
	r := &rig{t: t, dir: dir, store: filepath.Join(dir, "store"), port: freePort(t), lease: lease,
		concurrency: concurrency, seed: seed(t)}
	r.rng = rand.New(rand.NewPCG(r.seed, 1))
	r.url = fmt.Sprintf("nats://127.0.0.1:%d", r.port)
	t.Logf("seed %d (%s=%d replays the kills' choices and timing)", r.seed, envSeed, r.seed)
	t.Cleanup(func() {
		r.mu.Lock()
		all := append([]*proc{r.server}, r.workers...)
		r.mu.Unlock()
		for _, p := range all {
			if p != nil {
				p.kill()
			}
		}
		// A race in a child process fails the test, even one that passed.
		if races := r.grepLogs("WARNING: DATA RACE"); len(races) > 0 {
			t.Errorf("%d data races reported by child processes", len(races))
		}
		if t.Failed() {
			r.dumpLogs()
			t.Logf("replay with %s=%d", envSeed, r.seed)
		}
	})
	return r
}

// seed is the run's random seed: CAPSTAN_CHAOS_SEED's, or a new one.
func seed(t *testing.T) uint64 {
	t.Helper()
	if s := os.Getenv(envSeed); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: %v", envSeed, s, err)
		}
		return n
	}
	return rand.Uint64()
}

func freePort(t *testing.T) int { return testenv.FreePort(t) }

// capstanBin is the capstan binary to run as the server and the workers:
// CAPSTAN_CHAOS_BIN's, or the one TestMain built; "" for the test binary
// (CAPSTAN_CHAOS_BIN=self).
func capstanBin() string {
	switch bin := os.Getenv(envBin); bin {
	case "self":
		return ""
	case "":
		return builtBin
	default:
		return bin
	}
}

// cliBin is the capstan binary whose commands (status) the tests check.
func cliBin() string {
	if bin := os.Getenv(envBin); bin != "" && bin != "self" {
		return bin
	}
	return builtBin
}

// spawn starts a child process: the capstan binary with args when one is
// given, else the test binary in the role env names.
func (r *rig) spawn(name string, args []string, env ...string) *proc {
	r.t.Helper()
	exe := capstanBin()
	if r.workerEnv != nil && strings.HasPrefix(name, "worker-") {
		exe = ""
		env = append(env, r.workerEnv...)
	}
	if exe == "" {
		var err error
		if exe, err = os.Executable(); err != nil {
			r.t.Fatal(err)
		}
		args = nil
	}
	log, err := os.Create(filepath.Join(r.dir, name+".log"))
	if err != nil {
		r.t.Fatal(err)
	}
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		r.t.Fatalf("start %s: %v", name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		_ = log.Close()
		close(p.done)
	}()
	return p
}

// startServer starts the server process on the rig's store and port, and
// waits until JetStream answers.
func (r *rig) startServer() {
	r.t.Helper()
	r.mu.Lock()
	r.started++
	name := fmt.Sprintf("server-%d", r.started)
	r.mu.Unlock()
	p := r.spawn(name, []string{"server", "--store", r.store, "--listen", fmt.Sprintf("127.0.0.1:%d", r.port)},
		envRole+"=server", envStore+"="+r.store, envPort+"="+strconv.Itoa(r.port))
	r.mu.Lock()
	r.server = p
	r.mu.Unlock()
	deadline := time.Now().Add(60 * time.Second)
	for {
		if p.exited() {
			r.t.Fatalf("%s exited at start", name)
		}
		if nc, err := nats.Connect(r.url, nats.Timeout(time.Second)); err == nil {
			js, _ := jetstream.New(nc)
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_, err = js.AccountInfo(ctx)
			cancel()
			nc.Close()
			if err == nil {
				return
			}
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("%s not ready", name)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// killServer SIGKILLs the server process.
func (r *rig) killServer() {
	r.mu.Lock()
	p := r.server
	r.server = nil
	r.mu.Unlock()
	p.kill()
}

// workerSpec is how a worker process is started, beyond the rig's lease and
// concurrency: its --id (the process's own name when empty), --pool,
// --capabilities and --sweep-every (the command's defaults when empty).
type workerSpec struct {
	id, pool, capabilities string
	sweepEvery             time.Duration
}

// startWorker starts one more worker process as the rig's spec says; it does
// not wait for it.
func (r *rig) startWorker() { r.startWorkerAs(r.spec) }

// startWorkerAs starts one more worker process as spec says, and returns its
// process's name; it does not wait for it.
func (r *rig) startWorkerAs(spec workerSpec) string {
	r.mu.Lock()
	r.started++
	name := fmt.Sprintf("worker-%d", r.started)
	r.mu.Unlock()
	id := spec.id
	if id == "" {
		id = name
	}
	args := []string{"worker", "--nats", r.url, "--id", id, "--lease", r.lease.String(),
		"--concurrency", strconv.Itoa(r.concurrency), "--grace", "1s"}
	env := []string{envRole + "=worker", envURL + "=" + r.url, envWorkerID + "=" + id, envLease + "=" + r.lease.String(),
		envConcurrency + "=" + strconv.Itoa(r.concurrency)}
	if spec.pool != "" {
		args = append(args, "--pool", spec.pool)
		env = append(env, envPool+"="+spec.pool)
	}
	if spec.capabilities != "" {
		args = append(args, "--capabilities", spec.capabilities)
		env = append(env, envCapabilities+"="+spec.capabilities)
	}
	if spec.sweepEvery != 0 {
		args = append(args, "--sweep-every", spec.sweepEvery.String())
		env = append(env, envSweepEvery+"="+spec.sweepEvery.String())
	}
	p := r.spawn(name, args, env...)
	r.mu.Lock()
	r.workers = append(r.workers, p)
	r.mu.Unlock()
	return name
}

// killWorker SIGKILLs the running worker named name, or a random one when
// name is "" or not running. It returns the name of the worker killed.
func (r *rig) killWorker(name string) string {
	r.mu.Lock()
	if len(r.workers) == 0 {
		r.mu.Unlock()
		return ""
	}
	i := r.rng.IntN(len(r.workers))
	for j, p := range r.workers {
		if p.name == name {
			i = j
			r.aimed++
		}
	}
	p := r.workers[i]
	r.workers = append(r.workers[:i], r.workers[i+1:]...)
	r.kills++
	r.killed = append(r.killed, p.name)
	r.mu.Unlock()
	p.kill()
	return p.name
}

// chaos kills a worker and starts a new one every few hundred milliseconds
// until d has passed: the worker aim names, running an execution in flight,
// or a random one when aim names none. It returns the number of kills.
func (r *rig) chaos(d time.Duration, aim func() string) int {
	end := time.Now().Add(d)
	n := 0
	for time.Now().Before(end) {
		time.Sleep(time.Duration(250+r.randN(500)) * time.Millisecond)
		r.killWorker(aim())
		r.startWorker()
		n++
	}
	return n
}

func (r *rig) randN(n int) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rng.IntN(n)
}

// aimAtInFlight returns an aim for chaos: the worker named in the record of
// one of the last handler calls still running, or "" when it finds none.
func aimAtInFlight(b *broker.Broker) func() string {
	return func() string {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		s, err := b.JS.Stream(ctx, demo.CallsStream)
		if err != nil {
			return ""
		}
		last := s.CachedInfo().State.LastSeq
		for seq := last; seq > 0 && seq+8 > last; seq-- {
			m, err := s.GetMsg(ctx, seq)
			if err != nil {
				continue
			}
			rec, _, err := broker.Load[execution.Record](ctx, b.Executions, broker.Key(broker.Anonymous, m.Header.Get(demo.ExecutionIDHeader)))
			if err == nil && rec.State == execution.StateRunning && rec.Worker != "" {
				return rec.Worker
			}
		}
		return ""
	}
}

// connect opens a connection to the server that survives its restarts.
func (r *rig) connect() *nats.Conn {
	r.t.Helper()
	nc, err := nats.Connect(r.url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond),
		nats.ReconnectBufSize(64<<20))
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(nc.Close)
	return nc
}

// client returns a client once a worker has published every capability named.
func (r *rig) client(capabilities ...string) *executor.Client {
	r.t.Helper()
	c, err := executor.NewClient(r.connect(), executor.ClientConfig{Actor: envelope.Actor{Kind: "agent", ID: "chaos"}})
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { _ = c.Close() })
	deadline := time.Now().Add(60 * time.Second)
	for _, id := range capabilities {
		for {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_, err := testhooks.Broker(c).Catalog.Get(ctx, id)
			cancel()
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				r.t.Fatalf("no worker published %s", id)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return c
}

// status runs `capstan status ID` and decodes what it prints.
func (r *rig) status(id string) (*execution.Record, *envelope.Envelope) {
	r.t.Helper()
	var stderr strings.Builder
	cmd := exec.Command(cliBin(), "status", "--json", "--nats", r.url, id)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if strings.Contains(stderr.String(), "WARNING: DATA RACE") {
		r.t.Errorf("capstan status %s reported a data race:\n%s", id, stderr.String())
	}
	if err != nil {
		r.t.Fatalf("capstan status %s: %v\n%s", id, err, stderr.String())
	}
	var s struct {
		Record   *execution.Record  `json:"record"`
		Envelope *envelope.Envelope `json:"envelope"`
	}
	if err := json.Unmarshal(out, &s); err != nil {
		r.t.Fatalf("capstan status %s printed %s: %v", id, out, err)
	}
	return s.Record, s.Envelope
}

// grepLogs returns the child processes' log lines that mention s.
func (r *rig) grepLogs(s string) []string {
	files, _ := filepath.Glob(filepath.Join(r.dir, "*.log"))
	var out []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, s) {
				out = append(out, filepath.Base(f)+": "+line)
			}
		}
	}
	return out
}

// dumpLogs shows the warnings and errors the child processes logged.
func (r *rig) dumpLogs() {
	files, _ := filepath.Glob(filepath.Join(r.dir, "*.log"))
	shown := 0
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(fh)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() && shown < 60 {
			line := sc.Text()
			if strings.Contains(line, "level=ERROR") || strings.Contains(line, "panic") || strings.Contains(line, "DATA RACE") {
				r.t.Logf("%s: %s", filepath.Base(f), line)
				shown++
			}
		}
		_ = fh.Close()
	}
}
