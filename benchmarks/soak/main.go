// Command soak runs a long fixed-rate load on capstan with the server, one
// worker and the client as separate `capstan` processes on loopback, and
// records how the server's memory and store follow the executions it
// retains.
//
// Every interval it samples the resident memory of each process (from
// /proc: Linux), the server's Go heap (in use, allocated, and the live heap
// at the last collection, from its --pprof endpoint), the store's size on
// disk, and every stream's messages, bytes, subjects and interior deletes
// (JetStream stream info). It writes:
//
//	soak.csv          one row per sample
//	soak.png          the curves against time, the windows' fill marked
//	server-heap-records-full.pb.gz   the server's heap profile when the record window filled
//	server-heap-envelopes-full.pb.gz and when the envelope retention filled
//	server-heap.pb.gz                at the end of the load
//	server-heap-idle.pb.gz           at the end of the idle time after it
//	summary.txt       bytes of server memory per retained execution while
//	                  the windows fill, the plateau once they are full, and
//	                  disk per execution
//
// The retention windows are the server's --envelope-retention (how long an
// envelope, the one thing kept per finished execution, stays) and the
// worker's --record-window (how long a record outlives its last write).
// Short windows fill within a soak: the server's memory should grow with
// the executions retained while they fill, then stay flat.
//
// With --replot DIR it reads DIR/soak.csv back and writes DIR/soak.png and
// DIR/summary.txt again (give it the same windows).
//
// soak.sh builds capstan and this command and runs it; see there.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func main() {
	capstan := flag.String("capstan", "capstan", "the capstan `binary` to run")
	n := flag.Int("n", 200000, "executions to run")
	rate := flag.Int("rate", 1000, "executions started per second (open loop)")
	syncMode := flag.String("sync", "default", "the server's --sync: always or default")
	interval := flag.Duration("interval", 10*time.Second, "sampling interval")
	idle := flag.Duration("idle", 30*time.Second, "keep sampling this long after the load ends (is memory released when idle?)")
	out := flag.String("out", "soak-out", "output `directory`")
	workerConcurrency := flag.Int("worker-concurrency", 256, "the worker's --concurrency")
	envelopeRetention := flag.Duration("envelope-retention", 0, "the server's --envelope-retention (0: the server's default, 25h)")
	recordWindow := flag.Duration("record-window", 0, "the worker's --record-window (0: the deployment's, 15m for a new one)")
	replot := flag.String("replot", "", "read `DIR`/soak.csv and write DIR/soak.png and DIR/summary.txt again, running nothing")
	flag.Parse()

	cfg := config{capstan: *capstan, n: *n, rate: *rate, sync: *syncMode, interval: *interval,
		idle: *idle, out: *out, workerConcurrency: *workerConcurrency,
		envelopeRetention: *envelopeRetention, recordWindow: *recordWindow, gogc: serverGOGC()}
	var err error
	if *replot != "" {
		cfg.out = *replot
		err = replotDir(cfg)
	} else {
		err = run(cfg)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(1)
	}
}

type config struct {
	capstan           string
	n, rate           int
	sync              string
	interval, idle    time.Duration
	out               string
	workerConcurrency int
	// envelopeRetention and recordWindow are passed on when set.
	envelopeRetention, recordWindow time.Duration
	gogc                            int // the server's collector target
}

// Defaults of the server's --envelope-retention, the worker's
// --record-window and the executions stream's duplicate window, for marking
// when each window fills.
const (
	defaultEnvelopeRetention = 25 * time.Hour
	defaultRecordWindow      = 15 * time.Minute
	dedupWindow              = 2 * time.Minute
)

func (c config) envelopes() time.Duration {
	if c.envelopeRetention > 0 {
		return c.envelopeRetention
	}
	return defaultEnvelopeRetention
}

func (c config) records() time.Duration {
	if c.recordWindow > 0 {
		return c.recordWindow
	}
	return defaultRecordWindow
}

func (c config) title() string {
	return fmt.Sprintf("capstan soak: %d executions at %d/s, --sync %s, envelopes kept %v, records %v",
		c.n, c.rate, c.sync, short(c.envelopes()), short(c.records()))
}

// short prints 5m0s as 5m, 25h0m0s as 25h.
func short(d time.Duration) string {
	switch {
	case d%time.Hour == 0:
		return fmt.Sprintf("%dh", d/time.Hour)
	case d%time.Minute == 0:
		return fmt.Sprintf("%dm", d/time.Minute)
	}
	return d.String()
}

// serverGOGC is the collector target capstan server runs with: GOGC from
// the environment it inherits, else 50.
func serverGOGC() int {
	if v, ok := os.LookupEnv("GOGC"); ok {
		if n, err := strconv.Atoi(v); err == nil && n > 0 {
			return n
		}
	}
	return 50
}

// proc is one capstan process and what it printed.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  *os.File
	done chan struct{}
	err  error
}

func start(cfg config, name string, env []string, args ...string) (*proc, error) {
	log, err := os.Create(filepath.Join(cfg.out, name+".log"))
	if err != nil {
		return nil, err
	}
	p := &proc{name: name, cmd: exec.Command(cfg.capstan, args...), log: log, done: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = log, log
	p.cmd.Env = append(os.Environ(), env...)
	if err := p.cmd.Start(); err != nil {
		log.Close()
		return nil, err
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	return p, nil
}

// waitFor waits until the process's log matches re and returns the match's
// first group.
func (p *proc) waitFor(re *regexp.Regexp, within time.Duration) (string, error) {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		b, _ := os.ReadFile(p.log.Name())
		if m := re.FindSubmatch(b); m != nil {
			return string(m[1]), nil
		}
		select {
		case <-p.done:
			return "", fmt.Errorf("%s exited (%v) before it was ready; see %s", p.name, p.err, p.log.Name())
		case <-time.After(50 * time.Millisecond):
		}
	}
	return "", fmt.Errorf("%s not ready within %v; see %s", p.name, within, p.log.Name())
}

// stop sends SIGTERM and waits, then kills after a bound.
func (p *proc) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	p.log.Close()
}

var (
	listeningRe = regexp.MustCompile(`capstan server listening on (\S+)`)
	pprofRe     = regexp.MustCompile(`profiles on (http://\S+/debug/pprof/)`)
	workerRe    = regexp.MustCompile(`(worker started)`)
)

func run(cfg config) error {
	if err := os.MkdirAll(cfg.out, 0o755); err != nil {
		return err
	}
	store, err := os.MkdirTemp("", "capstan-soak-store-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(store)

	var procs []*proc
	defer func() {
		for i := len(procs) - 1; i >= 0; i-- {
			procs[i].stop()
		}
	}()
	// launch starts one of the processes, stopped at the end in reverse.
	launch := func(name string, env []string, args ...string) (*proc, error) {
		p, err := start(cfg, name, env, args...)
		if err == nil {
			procs = append(procs, p)
		}
		return p, err
	}
	serverArgs := []string{"server", "--store", store, "--listen", "127.0.0.1:0", "--pprof", "127.0.0.1:0", "--sync", cfg.sync}
	if cfg.envelopeRetention > 0 {
		serverArgs = append(serverArgs, "--envelope-retention", cfg.envelopeRetention.String())
	}
	server, err := launch("server", nil, serverArgs...)
	if err != nil {
		return err
	}
	url, err := server.waitFor(listeningRe, time.Minute)
	if err != nil {
		return err
	}
	pprofURL, err := server.waitFor(pprofRe, time.Second)
	if err != nil {
		return err
	}
	env := []string{"CAPSTAN_NATS_URL=" + url}
	workerArgs := []string{"worker", "--concurrency", strconv.Itoa(cfg.workerConcurrency)}
	if cfg.recordWindow > 0 {
		workerArgs = append(workerArgs, "--record-window", cfg.recordWindow.String())
	}
	worker, err := launch("worker", env, workerArgs...)
	if err != nil {
		return err
	}
	if _, err := worker.waitFor(workerRe, time.Minute); err != nil {
		return err
	}

	nc, err := nats.Connect(url, nats.Name("capstan soak sampler"))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}

	fmt.Printf("soak: %d executions at %d/s, --sync %s, envelopes kept %v, records %v after their last write, sampling every %v; server %s\n",
		cfg.n, cfg.rate, cfg.sync, cfg.envelopes(), cfg.records(), cfg.interval, url)
	fmt.Printf("soak: machine load average %s\n", loadavg())
	started := time.Now()
	bench, err := launch("bench", env, "bench", "--workers", "0", "--rate", fmt.Sprintf("%d/s", cfg.rate),
		"--n", strconv.Itoa(cfg.n), "--no-baseline", "--json", "--timeout", "24h")
	if err != nil {
		return err
	}

	s := &sampler{cfg: cfg, js: js, store: store, pprofURL: pprofURL, start: started,
		pids: map[string]int{"server": server.cmd.Process.Pid, "worker": worker.cmd.Process.Pid, "client": bench.cmd.Process.Pid}}
	tick := time.NewTicker(cfg.interval)
	defer tick.Stop()
	s.sample("load")
	// A heap profile (after a forced collection) when each window fills.
	fills := []struct {
		at   time.Duration
		file string
	}{{cfg.records(), "server-heap-records-full.pb.gz"}, {cfg.envelopes(), "server-heap-envelopes-full.pb.gz"}}
	var loadEnded time.Time
	for loadEnded.IsZero() || time.Since(loadEnded) < cfg.idle {
		select {
		case <-bench.done:
			if loadEnded.IsZero() {
				loadEnded = time.Now()
				s.sample("load")
				fmt.Printf("soak: load ended after %v (%v); load average %s\n", time.Since(started).Round(time.Second), bench.err, loadavg())
				if err := s.heapProfile(filepath.Join(cfg.out, "server-heap.pb.gz")); err != nil {
					fmt.Fprintln(os.Stderr, "soak: heap profile:", err)
				}
				delete(s.pids, "client")
			}
		case <-tick.C:
			phase := "load"
			if !loadEnded.IsZero() {
				phase = "idle"
			}
			s.sample(phase)
			for len(fills) > 0 && loadEnded.IsZero() && time.Since(started) >= fills[0].at {
				if err := s.heapProfile(filepath.Join(cfg.out, fills[0].file)); err != nil {
					fmt.Fprintln(os.Stderr, "soak: heap profile:", err)
				}
				fills = fills[1:]
			}
		}
		select {
		case <-server.done:
			return fmt.Errorf("the server exited: %v; see %s", server.err, server.log.Name())
		default:
		}
	}
	if err := s.heapProfile(filepath.Join(cfg.out, "server-heap-idle.pb.gz")); err != nil {
		fmt.Fprintln(os.Stderr, "soak: heap profile:", err)
	}
	if bench.err != nil {
		fmt.Printf("soak: bench: %v (see %s)\n", bench.err, bench.log.Name())
	}
	if err := s.writeCSV(filepath.Join(cfg.out, "soak.csv")); err != nil {
		return err
	}
	return s.report(loadavg())
}

// report writes the plot and the summary.
func (s *sampler) report(load string) error {
	if err := plotSamples(s.rows, s.streams, s.cfg, filepath.Join(s.cfg.out, "soak.png")); err != nil {
		return err
	}
	sum := s.summary(load)
	fmt.Print(sum)
	return os.WriteFile(filepath.Join(s.cfg.out, "summary.txt"), []byte(sum), 0o644)
}

// row is one sample.
type row struct {
	at         time.Duration
	phase      string  // load or idle
	load1      float64 // the machine's load average over a minute
	executions uint64  // envelopes ever stored: executions finished
	retained   uint64  // envelopes kept now: executions retained
	records    uint64  // execution records kept now
	submitted  uint64  // requests the exec stream received

	serverRSS, workerRSS, clientRSS int64
	// The server's Go heap: spans in use, objects allocated (live and not
	// yet collected), the live heap at the last collection (estimated as
	// the next collection's goal over 1 + GOGC/100), memory from the OS.
	serverHeapInuse, serverHeapAlloc, serverLive, serverSys int64
	storeBytes                                              int64
	streams                                                 map[string]jetstream.StreamState
}

// windows says which windows are full at r: none, records, or
// records+envelopes.
func (c config) windows(at time.Duration) string {
	switch {
	case at >= c.envelopes() && at >= c.records():
		return "records+envelopes"
	case at >= c.records():
		return "records"
	case at >= c.envelopes():
		return "envelopes"
	}
	return "none"
}

type sampler struct {
	cfg      config
	js       jetstream.JetStream
	store    string
	pprofURL string
	start    time.Time
	pids     map[string]int
	rows     []row
	streams  []string // every stream seen, sorted
}

func (s *sampler) sample(phase string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r := row{at: time.Since(s.start), phase: phase, load1: load1(), streams: map[string]jetstream.StreamState{}}
	r.serverRSS = rss(s.pids["server"])
	r.workerRSS = rss(s.pids["worker"])
	r.clientRSS = rss(s.pids["client"])
	var nextGC int64
	r.serverHeapInuse, r.serverHeapAlloc, nextGC, r.serverSys = s.heapStats(ctx)
	r.serverLive = int64(float64(nextGC) / (1 + float64(s.cfg.gogc)/100))
	r.storeBytes = dirSize(s.store)
	lister := s.js.ListStreams(ctx)
	for info := range lister.Info() {
		r.streams[info.Config.Name] = info.State
		if !slices.Contains(s.streams, info.Config.Name) {
			s.streams = append(s.streams, info.Config.Name)
			slices.Sort(s.streams)
		}
	}
	r.fill()
	s.rows = append(s.rows, r)
	fmt.Printf("%6.0fs %-4s %8d executions, %7d retained, %6d records  server RSS %6.1f MB (heap %6.1f MB in use, %6.1f MB live)  worker %5.1f MB  client %5.1f MB  store %7.1f MB  load %.1f\n",
		r.at.Seconds(), phase, r.executions, r.retained, r.records, mb(r.serverRSS), mb(r.serverHeapInuse), mb(r.serverLive),
		mb(r.workerRSS), mb(r.clientRSS), mb(r.storeBytes), r.load1)
}

// fill derives the execution counts from the streams.
func (r *row) fill() {
	for name, st := range r.streams {
		switch {
		case strings.HasSuffix(name, "_ENVELOPES"):
			r.executions, r.retained = st.LastSeq, st.Msgs
		case strings.HasSuffix(name, "_EXECUTIONS"):
			r.records = st.Msgs
		case strings.HasSuffix(name, "_EXEC"):
			r.submitted = st.LastSeq
		}
	}
}

// rss reads a process's resident set size from /proc (Linux); 0 elsewhere.
func rss(pid int) int64 {
	if pid == 0 {
		return 0
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// heapStats reads the server's HeapInuse, HeapAlloc, NextGC and Sys from
// the heap profile's text form, which ends with the runtime's MemStats.
func (s *sampler) heapStats(ctx context.Context) (inuse, alloc, nextGC, sys int64) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.pprofURL+"heap?debug=1", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, 0, 0, 0
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		for _, f := range []struct {
			prefix string
			v      *int64
		}{{"# HeapInuse = ", &inuse}, {"# HeapAlloc = ", &alloc}, {"# NextGC = ", &nextGC}, {"# Sys = ", &sys}} {
			if v, ok := strings.CutPrefix(line, f.prefix); ok {
				*f.v, _ = strconv.ParseInt(v, 10, 64)
			}
		}
	}
	return inuse, alloc, nextGC, sys
}

func (s *sampler) heapProfile(path string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.pprofURL+"heap?gc=1", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return errors.New(resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func dirSize(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

func mb(b int64) float64 { return float64(b) / (1 << 20) }

// load1 is the machine's load average over the last minute.
func load1() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}
