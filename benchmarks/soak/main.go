// Command soak runs a long fixed-rate load on capstan with the server, one
// worker and the client as separate `capstan` processes on loopback, and
// records how the server's memory and store follow the executions it
// retains.
//
// Every interval it samples the resident memory of each process (from
// /proc: Linux), the server's Go heap in use (from its --pprof endpoint),
// the store's size on disk, and every stream's messages, bytes, subjects
// and interior deletes (JetStream stream info). It writes:
//
//	soak.csv          one row per sample
//	soak.png          the curves against executions completed
//	server-heap.pb.gz the server's heap profile at the end of the load
//	server-heap-idle.pb.gz  and at the end of the idle time after it
//	summary.txt       bytes of server memory and of disk per execution
//
// soak.sh builds capstan and this command and runs it; see there.
package main

import (
	"bufio"
	"context"
	"encoding/csv"
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
	flag.Parse()

	if err := run(config{capstan: *capstan, n: *n, rate: *rate, sync: *syncMode, interval: *interval,
		idle: *idle, out: *out, workerConcurrency: *workerConcurrency}); err != nil {
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
	server, err := start(cfg, "server", nil, "server", "--store", store, "--listen", "127.0.0.1:0",
		"--pprof", "127.0.0.1:0", "--sync", cfg.sync)
	if err != nil {
		return err
	}
	procs = append(procs, server)
	url, err := server.waitFor(listeningRe, time.Minute)
	if err != nil {
		return err
	}
	pprofURL, err := server.waitFor(pprofRe, time.Second)
	if err != nil {
		return err
	}
	env := []string{"CAPSTAN_NATS_URL=" + url}
	worker, err := start(cfg, "worker", env, "worker", "--concurrency", strconv.Itoa(cfg.workerConcurrency))
	if err != nil {
		return err
	}
	procs = append(procs, worker)
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

	fmt.Printf("soak: %d executions at %d/s, --sync %s, sampling every %v; server %s\n", cfg.n, cfg.rate, cfg.sync, cfg.interval, url)
	fmt.Printf("soak: machine load average %s\n", loadavg())
	started := time.Now()
	bench, err := start(cfg, "bench", env, "bench", "--workers", "0", "--rate", fmt.Sprintf("%d/s", cfg.rate),
		"--n", strconv.Itoa(cfg.n), "--no-baseline", "--json", "--timeout", "24h")
	if err != nil {
		return err
	}
	procs = append(procs, bench)

	s := &sampler{cfg: cfg, js: js, store: store, pprofURL: pprofURL, start: started,
		pids: map[string]int{"server": server.cmd.Process.Pid, "worker": worker.cmd.Process.Pid, "client": bench.cmd.Process.Pid}}
	tick := time.NewTicker(cfg.interval)
	defer tick.Stop()
	s.sample("load")
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
	if err := plotSamples(s.rows, s.streams, filepath.Join(cfg.out, "soak.png"),
		fmt.Sprintf("capstan soak: %d executions at %d/s, --sync %s", cfg.n, cfg.rate, cfg.sync)); err != nil {
		return err
	}
	sum := s.summary()
	fmt.Print(sum)
	return os.WriteFile(filepath.Join(cfg.out, "summary.txt"), []byte(sum), 0o644)
}

// row is one sample.
type row struct {
	at                         time.Duration
	phase                      string
	executions                 uint64 // envelopes stored
	submitted                  uint64 // requests the exec stream received
	serverRSS, workerRSS       int64
	clientRSS                  int64
	serverHeapInuse, serverSys int64
	storeBytes                 int64
	streams                    map[string]jetstream.StreamState
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
	r := row{at: time.Since(s.start), phase: phase, streams: map[string]jetstream.StreamState{}}
	r.serverRSS = rss(s.pids["server"])
	r.workerRSS = rss(s.pids["worker"])
	r.clientRSS = rss(s.pids["client"])
	r.serverHeapInuse, r.serverSys = s.heapStats(ctx)
	r.storeBytes = dirSize(s.store)
	lister := s.js.ListStreams(ctx)
	for info := range lister.Info() {
		r.streams[info.Config.Name] = info.State
		if !slices.Contains(s.streams, info.Config.Name) {
			s.streams = append(s.streams, info.Config.Name)
			slices.Sort(s.streams)
		}
	}
	for name, st := range r.streams {
		switch {
		case strings.HasSuffix(name, "_ENVELOPES"):
			r.executions = st.Msgs
		case strings.HasSuffix(name, "_EXEC"):
			r.submitted = st.LastSeq
		}
	}
	s.rows = append(s.rows, r)
	fmt.Printf("%6.0fs %-4s %8d executions  server RSS %6.1f MB (heap %6.1f MB)  worker %5.1f MB  client %5.1f MB  store %7.1f MB\n",
		r.at.Seconds(), phase, r.executions, mb(r.serverRSS), mb(r.serverHeapInuse), mb(r.workerRSS), mb(r.clientRSS), mb(r.storeBytes))
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

// heapStats reads the server's HeapInuse and Sys from the heap profile's
// text form, which ends with the runtime's MemStats.
func (s *sampler) heapStats(ctx context.Context) (inuse, sys int64) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.pprofURL+"heap?debug=1", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, 0
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if v, ok := strings.CutPrefix(line, "# HeapInuse = "); ok {
			inuse, _ = strconv.ParseInt(v, 10, 64)
		}
		if v, ok := strings.CutPrefix(line, "# Sys = "); ok {
			sys, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	return inuse, sys
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

func (s *sampler) writeCSV(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := csv.NewWriter(f)
	head := []string{"seconds", "phase", "executions", "submitted", "server_rss_bytes", "server_heap_inuse_bytes", "server_sys_bytes",
		"worker_rss_bytes", "client_rss_bytes", "store_bytes"}
	for _, name := range s.streams {
		head = append(head, name+"_msgs", name+"_bytes", name+"_subjects", name+"_deleted")
	}
	_ = w.Write(head)
	for _, r := range s.rows {
		rec := []string{strconv.FormatFloat(r.at.Seconds(), 'f', 1, 64), r.phase, u(r.executions), u(r.submitted),
			i(r.serverRSS), i(r.serverHeapInuse), i(r.serverSys), i(r.workerRSS), i(r.clientRSS), i(r.storeBytes)}
		for _, name := range s.streams {
			st := r.streams[name]
			rec = append(rec, u(st.Msgs), u(st.Bytes), u(st.NumSubjects), strconv.Itoa(st.NumDeleted))
		}
		_ = w.Write(rec)
	}
	w.Flush()
	if err := w.Error(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func u(v uint64) string { return strconv.FormatUint(v, 10) }
func i(v int64) string  { return strconv.FormatInt(v, 10) }

// summary states the bytes per execution: the least-squares slope of each
// curve against executions over the load's second half (past the start-up),
// and each stream's bytes per execution at the end of the load.
func (s *sampler) summary() string {
	var load []row
	for _, r := range s.rows {
		if r.phase == "load" && r.executions > 0 {
			load = append(load, r)
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "capstan soak: %d executions at %d/s, --sync %s; load average at the end %s\n", s.cfg.n, s.cfg.rate, s.cfg.sync, loadavg())
	if len(load) < 4 {
		fmt.Fprintf(&b, "too few samples under load (%d) for slopes\n", len(load))
		return b.String()
	}
	last := load[len(load)-1]
	half := load[len(load)/2:]
	slope := func(y func(row) int64) float64 {
		var sx, sy, sxx, sxy float64
		for _, r := range half {
			x, v := float64(r.executions), float64(y(r))
			sx, sy, sxx, sxy = sx+x, sy+v, sxx+x*x, sxy+x*v
		}
		k := float64(len(half))
		den := k*sxx - sx*sx
		if den == 0 {
			return 0
		}
		return (k*sxy - sx*sy) / den
	}
	fmt.Fprintf(&b, "executions completed: %d (the last sample under load)\n", last.executions)
	fmt.Fprintf(&b, "growth per execution over the load's second half (least squares):\n")
	fmt.Fprintf(&b, "  server RSS       %8.0f bytes   (at the end %.0f MB)\n", slope(func(r row) int64 { return r.serverRSS }), mb(last.serverRSS))
	fmt.Fprintf(&b, "  server heap      %8.0f bytes   (at the end %.0f MB in use)\n", slope(func(r row) int64 { return r.serverHeapInuse }), mb(last.serverHeapInuse))
	fmt.Fprintf(&b, "  worker RSS       %8.0f bytes   (at the end %.0f MB)\n", slope(func(r row) int64 { return r.workerRSS }), mb(last.workerRSS))
	fmt.Fprintf(&b, "  client RSS       %8.0f bytes   (at the end %.0f MB)\n", slope(func(r row) int64 { return r.clientRSS }), mb(last.clientRSS))
	fmt.Fprintf(&b, "  store on disk    %8.0f bytes   (at the end %.0f MB)\n", slope(func(r row) int64 { return r.storeBytes }), mb(last.storeBytes))
	fmt.Fprintf(&b, "per stream at the end of the load (bytes, messages, subjects, interior deletes, each per execution):\n")
	for _, name := range s.streams {
		st := last.streams[name]
		e := float64(last.executions)
		fmt.Fprintf(&b, "  %-28s %8.0f B %6.2f msgs %6.2f subjects %6.2f deletes   (%d msgs, %d subjects, %d deletes, %.1f MB)\n",
			name, float64(st.Bytes)/e, float64(st.Msgs)/e, float64(st.NumSubjects)/e, float64(st.NumDeleted)/e,
			st.Msgs, st.NumSubjects, st.NumDeleted, mb(int64(st.Bytes)))
	}
	if idle := s.rows[len(s.rows)-1]; idle.phase == "idle" {
		fmt.Fprintf(&b, "after %v idle: server RSS %.0f MB, heap %.0f MB in use\n", (idle.at - last.at).Round(time.Second), mb(idle.serverRSS), mb(idle.serverHeapInuse))
	}
	return b.String()
}
