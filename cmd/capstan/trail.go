package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/mod/sumdb/note"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/auditproof"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/trail"
	"github.com/capstan-dev/capstan/telemetry"
)

// The audit log's commands (DESIGN §8, "The trail as a log"): 'capstan
// audit' followed by one of these words; any other first argument is an
// execution id.
var auditLogCommands = map[string]func(args []string) int{
	"checkpoint":   runAuditCheckpoint,
	"prove":        runAuditProve,
	"verify":       runAuditVerify,
	"export":       runAuditExport,
	"keygen":       runAuditKeygen,
	"checkpointer": runAuditCheckpointer,
}

// auditLogUsage is what 'capstan audit --help' adds about them.
const auditLogUsage = `
the audit log (an RFC 6962 transparency log of the trail, with signed checkpoints):
  capstan audit checkpoint [--key FILE] > FILE    the latest signed checkpoint, to keep
  capstan audit prove ID [--key FILE]             an execution's events and envelope, proved in the latest checkpoint
  capstan audit verify [--bundle FILE] [--since FILE] [--key FILE]
                                                  check the whole log (the deployment's, or an exported bundle's)
  capstan audit export [--out FILE]               the log as a bundle, for an auditor without access
  capstan audit keygen [--dir D] [--log-name N] [--rotate]
                                                  a signing key (capstan auth init makes one)
  capstan audit checkpointer --key FILE           sign checkpoints (capstan server does with its key)
`

// defaultCheckpointInterval is how often a checkpointer signs while events
// arrive.
const defaultCheckpointInterval = time.Second

// checkpointerFlags choose a process's audit signing key.
type checkpointerFlags struct {
	key      string
	interval time.Duration
}

func addCheckpointerFlags(fs *flag.FlagSet, def string) *checkpointerFlags {
	f := &checkpointerFlags{}
	fs.StringVar(&f.key, "audit-key", "", "audit log signing key `file` (made by 'capstan auth init' or 'capstan audit keygen'): sign checkpoints of the audit log, one process of the deployment at a time ("+def+"; \"off\": none)")
	fs.DurationVar(&f.interval, "checkpoint-every", defaultCheckpointInterval, "how often checkpoints are signed while audit events arrive: the bound of their lag")
	return f
}

// checkpointer is a running checkpointer and what stops it.
type checkpointer struct {
	cp   *trail.Checkpointer
	stop func()
}

// startCheckpointer runs a checkpointer with the key at keyPath on b until
// stop, registering its metrics on reg when given.
func startCheckpointer(b *broker.Broker, keyPath string, cfg trail.Config, reg prometheus.Registerer) (*checkpointer, error) {
	signer, vkey, err := trail.LoadSigner(keyPath)
	if err != nil {
		return nil, err
	}
	known, _, err := trail.LoadVerifiers(filepath.Join(filepath.Dir(keyPath), trail.PublicKeyFile))
	if err != nil {
		return nil, err
	}
	if reg != nil {
		m := newCheckpointMetrics(reg)
		cfg.OnCheckpoint, cfg.OnError = m.checkpointed, m.failed
	}
	log := cfg.Log
	ctx, cancel := context.WithCancel(context.Background())
	cp := trail.NewCheckpointer(b, signer, vkey, known, cfg)
	if reg != nil {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "capstan_audit_checkpointer_holding",
			Help: "1 while this process's checkpointer holds the deployment's checkpointing lease, 0 otherwise."},
			func() float64 {
				if cp.Holding() {
					return 1
				}
				return 0
			}))
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = cp.Run(ctx) }()
	log.Info("audit checkpointer started", "log", signer.Name(), "every", cfg.Interval)
	return &checkpointer{cp: cp, stop: func() { cancel(); wg.Wait() }}, nil
}

// checkpointMetrics are a checkpointer's Prometheus metrics.
type checkpointMetrics struct {
	lag    prometheus.Histogram
	size   prometheus.Gauge
	signed prometheus.Counter
	errors prometheus.Counter
}

func newCheckpointMetrics(reg prometheus.Registerer) *checkpointMetrics {
	m := &checkpointMetrics{
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "capstan_audit_checkpoint_lag_seconds",
			Help:    "Age of the oldest audit event a checkpoint newly covers, when the checkpoint is stored: how long an event waits to be provable.",
			Buckets: []float64{0.25, 0.5, 1, 1.5, 2, 3, 5, 10, 30, 60, 300}}),
		size: prometheus.NewGauge(prometheus.GaugeOpts{Name: "capstan_audit_checkpoint_size",
			Help: "Leaves (stored audit messages) in the latest checkpoint this process signed."}),
		signed: prometheus.NewCounter(prometheus.CounterOpts{Name: "capstan_audit_checkpoints_total",
			Help: "Checkpoints of the audit log this process signed and stored."}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{Name: "capstan_audit_checkpoint_errors_total",
			Help: "Failures to extend or sign the audit log (a stream that lost events is one, every interval, until it is looked at)."}),
	}
	reg.MustRegister(m.lag, m.size, m.signed, m.errors)
	return m
}

func (m *checkpointMetrics) checkpointed(size int64, _ int, lag time.Duration) {
	m.lag.Observe(lag.Seconds())
	m.size.Set(float64(size))
	m.signed.Inc()
}

func (m *checkpointMetrics) failed(error) { m.errors.Inc() }

// serverAuditKey is the key file a server or dev process checkpoints with:
// the flag's, else the auth directory's when it has one, else none.
func serverAuditKey(f *checkpointerFlags, authDir string) (string, error) {
	switch {
	case f.key == "off":
		return "", nil
	case f.key != "":
		return f.key, nil
	case authDir != "":
		p := filepath.Join(authDir, trail.KeyFile)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", nil
}

func runAuditCheckpointer(args []string) int {
	fs := newFlags("audit checkpointer", "--key FILE [--every D] [--lease D] [--metrics HOST:PORT] [--name N]")
	conn := addConnFlags(fs)
	key := fs.String("key", "", "the audit log's signing key `file` (its audit.pub beside it)")
	every := fs.Duration("every", defaultCheckpointInterval, "how often checkpoints are signed while audit events arrive")
	lease := fs.Duration("lease", 10*time.Second, "how long the checkpointing duty stays with a checkpointer that stopped renewing it (killed, cut off) before another takes over; at least 3 × --every")
	metrics := fs.String("metrics", "", "serve Prometheus metrics on http://`HOST:PORT`/metrics")
	name := fs.String("name", "", "this checkpointer's name in the lease and logs (default host-pid)")
	wait := fs.Duration("wait", 0, "how long to wait for the servers, retrying (0: until stopped)")
	if _, code, ok := parseFlags(fs, args, 0); !ok {
		return code
	}
	if *key == "" {
		return usageError("audit checkpointer: want --key FILE, the log's signing key ('capstan audit keygen' or 'capstan auth init' makes one)")
	}
	if *every <= 0 {
		return usageError("--every must be positive")
	}
	if *name == "" {
		host, _ := os.Hostname()
		*name = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	log := newLogger(slog.LevelInfo)
	ctx, stop := signalContext()
	defer stop()
	o, err := conn.options("audit checkpointer")
	if err != nil {
		return usageError("%v", err)
	}
	nc, err := broker.ConnectWait(ctx, o, *wait, log)
	if err != nil {
		if ctx.Err() != nil {
			return exitOK
		}
		return fail(exitUsage, "audit checkpointer: %v", err)
	}
	defer nc.Close()
	var b *broker.Broker
	for {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		b, err = broker.Provision(pctx, nc, broker.Config{})
		cancel()
		if err == nil || errors.Is(err, broker.ErrConfigConflict) || ctx.Err() != nil {
			break
		}
		log.Warn("waiting for the cluster: provisioning failed; retrying", "err", err)
		sleepCtx(ctx, time.Second)
	}
	if err != nil {
		if ctx.Err() != nil {
			return exitOK
		}
		return fail(exitUsage, "audit checkpointer: %v", err)
	}
	var reg prometheus.Registerer
	if *metrics != "" {
		tel := telemetry.New(telemetry.Options{})
		addr, _, err := tel.Serve(ctx, *metrics)
		if err != nil {
			return usageError("--metrics: %v", err)
		}
		reg = tel.Registry()
		log.Info("metrics served", "url", fmt.Sprintf("http://%s/metrics", addr))
	}
	c, err := startCheckpointer(b, *key, trail.Config{Interval: *every, Lease: *lease, Name: *name, Log: log}, reg)
	if err != nil {
		return fail(exitUsage, "audit checkpointer: %v", err)
	}
	fmt.Printf("capstan audit checkpointer %s: signing the audit log of %s every %v\n", *name, broker.RedactURL(o.ResolveURL()), *every)
	<-ctx.Done()
	c.stop()
	return exitOK
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

func runAuditKeygen(args []string) int {
	fs := newFlags("audit keygen", "[--dir D] [--log-name NAME] [--rotate]")
	dir := fs.String("dir", ".", "`directory` for audit.key (0600) and audit.pub")
	logName := fs.String("log-name", "", "the log's name, on every checkpoint and its key: unique, such as audit.example.com/payments (default capstan/capstan/<random>)")
	rotate := fs.Bool("rotate", false, "replace the signing key in --dir with a new one of the same log name; audit.pub keeps the old public keys, so earlier checkpoints still verify")
	if _, code, ok := parseFlags(fs, args, 0); !ok {
		return code
	}
	var vkey string
	var err error
	if *rotate {
		if *logName != "" {
			return usageError("--rotate keeps the log's name: --log-name does not go with it")
		}
		vkey, err = trail.Rotate(*dir)
	} else {
		name := *logName
		if name == "" {
			name = trail.DefaultOrigin("")
		}
		vkey, err = trail.Keygen(*dir, name)
	}
	if err != nil {
		return fail(exitFailed, "audit keygen: %v", err)
	}
	fmt.Printf("signing key %s (keep it private: it signs the log)\npublic key %s, now listing:\n  %s\n",
		filepath.Join(*dir, trail.KeyFile), filepath.Join(*dir, trail.PublicKeyFile), vkey)
	if *rotate {
		fmt.Println("restart the processes that sign with it (capstan server, capstan audit checkpointer)")
	}
	return exitOK
}

// auditReader is an admin's (or an open server's) connection to the log.
type auditReader struct {
	conn *connFlags
	key  string
}

func addAuditReader(fs *flag.FlagSet) *auditReader {
	r := &auditReader{conn: addConnFlags(fs)}
	fs.StringVar(&r.key, "key", "", "the log's public key `file` (audit.pub), your own copy (default: audit.pub beside --creds, else the key the deployment states)")
	return r
}

// open connects and binds every resource, refusing at once credentials that
// may not read the audit stream.
func (r *auditReader) open(ctx context.Context, what string) (*broker.Broker, func(), error) {
	if err := r.conn.need(what, streamInfo(names.AuditStream()),
		"only admins read the audit log; 'capstan audit ID' reads one execution's trail"); err != nil {
		return nil, nil, err
	}
	nc, err := r.conn.connect("audit")
	if err != nil {
		return nil, nil, err
	}
	b, err := broker.OpenAll(ctx, nc, broker.Config{})
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return b, nc.Close, nil
}

// keys returns the verifier keys to check with, as text and parsed, and
// says whose they are: --key's, the auth directory's beside --creds, or
// (b not nil) the deployment's own word.
func (r *auditReader) keys(ctx context.Context, b *broker.Broker) (string, note.Verifiers, string, error) {
	path, from := r.key, ""
	if path == "" && r.conn.creds != "" {
		if p := filepath.Join(filepath.Dir(r.conn.creds), trail.PublicKeyFile); fileExists(p) {
			path = p
		}
	}
	var text string
	switch {
	case path != "":
		data, err := os.ReadFile(path)
		if err != nil {
			return "", nil, "", fmt.Errorf("--key: %w", err)
		}
		text, from = string(data), path+"'s"
	case b == nil:
		return "", nil, "", errors.New("want --key FILE, the log's public key (audit.pub): a bundle is checked against your copy of it")
	default:
		var err error
		if text, err = trail.StatedKeys(ctx, b); err != nil {
			return "", nil, "", err
		}
		from = "the deployment's own"
		fmt.Fprintln(os.Stderr, "capstan: checking against the public key the deployment states; give --key FILE, your own copy of audit.pub, to check against yours")
	}
	keys, _, err := trail.ParseVerifiers(text)
	if err != nil {
		return "", nil, "", fmt.Errorf("%s key: %w", from, err)
	}
	return text, keys, from, nil
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func runAuditCheckpoint(args []string) int {
	fs := newFlags("audit checkpoint", "[--key FILE] > FILE")
	r := addAuditReader(fs)
	if _, code, ok := parseFlags(fs, args, 0); !ok {
		return code
	}
	ctx, stop := signalContext()
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, submitTimeout)
	defer cancel()
	b, closeFn, err := r.open(ctx, "read the audit log")
	if err != nil {
		return usageError("audit checkpoint: %v", err)
	}
	defer closeFn()
	_, keys, from, err := r.keys(ctx, b)
	if err != nil {
		return usageError("audit checkpoint: %v", err)
	}
	signed, err := trail.Latest(ctx, b, keys)
	if err != nil {
		return fail(exitFailed, "audit checkpoint: %v", err)
	}
	cp, err := trail.Open(signed, keys)
	if err != nil {
		return fail(exitFailed, "audit checkpoint: the latest stored checkpoint does not verify with %s key: %v", from, err)
	}
	if _, err := os.Stdout.Write(signed); err != nil {
		return fail(exitFailed, "audit checkpoint: %v", err)
	}
	fmt.Fprintf(os.Stderr, "capstan: checkpoint of %s: %d leaves, to %s\n", cp.Origin, cp.Size, cp.Time.UTC().Format(time.RFC3339))
	return exitOK
}

func runAuditExport(args []string) int {
	fs := newFlags("audit export", "[--out FILE]")
	r := addAuditReader(fs)
	out := fs.String("out", "", "write the bundle to `file` (default stdout)")
	if _, code, ok := parseFlags(fs, args, 0); !ok {
		return code
	}
	ctx, stop := signalContext()
	defer stop()
	b, closeFn, err := r.open(ctx, "read the audit log")
	if err != nil {
		return usageError("audit export: %v", err)
	}
	defer closeFn()
	w := io.Writer(os.Stdout)
	if *out != "" {
		f, err := os.Create(*out)
		if err != nil {
			return usageError("audit export: %v", err)
		}
		defer f.Close()
		w = f
	}
	n, err := trail.Export(ctx, trail.FromDeployment(b), w, time.Now())
	if err != nil {
		return fail(exitFailed, "audit export: %v", err)
	}
	fmt.Fprintf(os.Stderr, "capstan: exported %d audit messages with the log's checkpoints and hashes\n", n)
	return exitOK
}

func runAuditVerify(args []string) int {
	fs := newFlags("audit verify", "[--bundle FILE] [--since FILE] [--keep FILE] [--key FILE] [-o json]")
	r := addAuditReader(fs)
	o := addOutputFlags(fs)
	bundle := fs.String("bundle", "", "verify an exported bundle `file` (offline: needs --key) instead of the deployment")
	since := fs.String("since", "", "a checkpoint `file` you kept ('capstan audit checkpoint'), or a bundle: prove that everything it covered is still there, unchanged, in order")
	keep := fs.String("keep", "", "once the log verifies, write its latest checkpoint, which then extends --since, to `file` (a witness's next --since)")
	if _, code, ok := parseOutput(fs, args, 0, o); !ok {
		return code
	}
	ctx, stop := signalContext()
	defer stop()
	var src trail.Source
	var b *broker.Broker
	if *bundle != "" {
		var err error
		if src, err = trail.ReadBundle(*bundle); err != nil {
			return usageError("audit verify: %v", err)
		}
	} else {
		var closeFn func()
		var err error
		if b, closeFn, err = r.open(ctx, "verify the audit log"); err != nil {
			return usageError("audit verify: %v", err)
		}
		defer closeFn()
		src = trail.FromDeployment(b)
	}
	_, keys, _, err := r.keys(ctx, b)
	if err != nil {
		return usageError("audit verify: %v", err)
	}
	var opts trail.VerifyOptions
	if *since != "" {
		data, err := os.ReadFile(*since)
		if err != nil {
			return usageError("--since: %v", err)
		}
		if bytes.HasPrefix(bytes.TrimSpace(data), []byte("{")) {
			kb, err := trail.ReadBundle(*since)
			if err != nil {
				return usageError("--since: %v", err)
			}
			if opts.Kept, err = trail.LastCheckpoint(ctx, kb); err != nil || opts.Kept == nil {
				return usageError("--since %s: a bundle without a checkpoint", *since)
			}
			opts.KeptTiles = kb
		} else {
			opts.Kept = data
		}
	}
	rep, err := trail.Verify(ctx, src, keys, opts)
	if err != nil {
		return fail(exitFailed, "audit verify: %v", err)
	}
	if code := o.print(rep, func(w io.Writer, st style) { printVerify(w, st, rep) }); code != exitOK {
		return code
	}
	if !rep.OK() {
		return exitFailed
	}
	if *keep != "" && rep.Latest != nil {
		if err := writeKept(*keep, rep.Latest); err != nil {
			return fail(exitFailed, "audit verify: --keep: %v", err)
		}
	}
	return exitOK
}

// writeKept replaces path with a verified checkpoint, whole or not at all.
func writeKept(path string, signed []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".checkpoint-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.Write(signed)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), 0o644)
	}
	if err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

func printVerify(w io.Writer, st style, r *trail.Report) {
	fmt.Fprintf(w, "log %s (stream %s from sequence %d)\n", r.Origin, r.Stream, r.FirstSeq)
	fmt.Fprintf(w, "  checkpoints  %d stored, %d verified; the latest: %d leaves, to %s\n", r.Checkpoints, r.Verified, r.Size,
		r.Time.UTC().Format(time.RFC3339))
	fmt.Fprintf(w, "  events       %d read from the stream", r.Messages)
	if r.Unchecked > 0 {
		fmt.Fprintf(w, ", %d not in a checkpoint yet", r.Unchecked)
	}
	fmt.Fprintln(w)
	if r.RemovedByRetention > 0 {
		fmt.Fprintf(w, "  retention    the first %d were removed by the stream's age limit (%s), proved by the stored hashes\n",
			r.RemovedByRetention, (*longDuration)(&r.MaxAge).String())
	}
	if r.Kept > 0 {
		verdict := "does NOT hold"
		if r.KeptHolds {
			verdict = "holds: every event it covered is still there, unchanged, in order"
		}
		fmt.Fprintf(w, "  kept         the checkpoint of %d leaves %s\n", r.Kept, verdict)
	}
	if r.OK() {
		fmt.Fprintln(w, st.status("verified"))
		return
	}
	fmt.Fprintf(w, "%s: %d problem(s), the first event that does not match first\n", st.status("FAILED"), len(r.Problems))
	for _, p := range r.Problems {
		fmt.Fprintf(w, "  %s: %s\n", p.Kind, p.Detail)
	}
}

func runAuditProve(args []string) int {
	fs := newFlags("audit prove", "ID [--owner P] [--key FILE] [--wait D] [-o json]")
	r := addAuditReader(fs)
	o := addOutputFlags(fs)
	owner := fs.String("owner", "", "the `principal` whose execution it is (default: the one principal that has an execution of that id)")
	wait := fs.Duration("wait", 10*time.Second, "how long to wait for a checkpoint that covers the trail's last event")
	pos, code, ok := parseOutput(fs, args, 1, o)
	if !ok {
		return code
	}
	id := pos[0]
	if err := envelope.ValidExecutionID(id); err != nil {
		return usageError("%v", err)
	}
	ctx, stop := signalContext()
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, submitTimeout+*wait)
	defer cancel()
	b, closeFn, err := r.open(ctx, "prove a trail")
	if err != nil {
		return usageError("audit prove: %v", err)
	}
	defer closeFn()
	if *owner == "" {
		if *owner, err = ownerOf(ctx, b, broker.PrincipalOf(b.NC, b.Names), id); err != nil {
			return usageError("audit prove: %v", err)
		}
	}
	text, _, from, err := r.keys(ctx, b)
	if err != nil {
		return usageError("audit prove: %v", err)
	}
	p, err := auditproof.Prove(ctx, b, *owner, id, text)
	if errors.Is(err, broker.ErrNotFound) {
		return fail(exitUnknown, "audit prove: %v", err)
	}
	if err != nil {
		return fail(exitFailed, "audit prove: %v", err)
	}
	verr := p.Verify(text)
	if code := o.print(p, func(w io.Writer, st style) { printProof(w, st, p, id, *owner, from, verr) }); code != exitOK {
		return code
	}
	if verr != nil {
		if o.isJSON() {
			return fail(exitFailed, "audit prove: %v", verr)
		}
		return exitFailed
	}
	return exitOK
}

func printProof(w io.Writer, st style, p *audit.TrailProof, id, owner, from string, verr error) {
	cp, _ := trail.OpenUnverified([]byte(p.Checkpoint))
	events := 0
	for _, m := range p.Messages {
		events += len(m.Events)
	}
	fmt.Fprintf(w, "execution %s of %s: %d event(s) in %d stored message(s)\n", id, owner, events, len(p.Messages))
	if cp != nil {
		fmt.Fprintf(w, "checkpoint of %s: %d leaves, to %s, checked with %s key\n", cp.Origin, cp.Size, cp.Time.UTC().Format(time.RFC3339), from)
	}
	committed, stored := "", ""
	if p.Envelope != nil {
		sum := sha256.Sum256(p.Envelope)
		stored = hex.EncodeToString(sum[:])
	}
	for _, m := range p.Messages {
		types := make([]string, 0, len(m.Events))
		for _, ev := range m.Events {
			types = append(types, strings.TrimPrefix(ev.Type, "capability."))
			if h, ok := ev.Data["envelopeHash"].(string); ok && (committed == "" || h == stored) {
				// Of two runs' terminal events, the envelope's.
				committed = h
			}
		}
		fmt.Fprintf(w, "  sequence %-8d leaf %-8d %d-hash proof  %s\n", m.Seq, m.Leaf, len(m.Proof), strings.Join(types, ", "))
	}
	switch {
	case p.Envelope != nil && committed != "":
		fmt.Fprintf(w, "  envelope     sha256 %s, committed to by the terminal event\n", committed)
	case p.Envelope != nil:
		fmt.Fprintln(w, "  envelope     not committed to by the trail (an execution of an earlier version)")
	case committed != "":
		fmt.Fprintf(w, "  envelope     gone (retention); the trail commits to sha256 %s\n", committed)
	}
	if verr != nil {
		fmt.Fprintf(w, "%s: %v\n", st.status("FAILED"), verr)
		return
	}
	fmt.Fprintln(w, st.status("verified"))
}
