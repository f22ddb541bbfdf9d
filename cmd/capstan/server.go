package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/capstan-dev/capstan/auth"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/credfile"
	"github.com/capstan-dev/capstan/internal/demo"
	"github.com/capstan-dev/capstan/internal/natsserver"
	"github.com/capstan-dev/capstan/internal/trail"
	"github.com/capstan-dev/capstan/telemetry"
)

// serverFlags configure the embedded server of dev and server.
type serverFlags struct {
	store, listen string
	auditMaxAge   longDuration
	// envelopeRetention is the envelopes bucket's TTL.
	envelopeRetention longDuration
	// queueMaxBytes bounds each principal's queue (DESIGN §3).
	queueMaxBytes byteSize
	auth          string
	insecure      bool
	setup         *auth.Setup
	// wait bounds how long the start waits for the cluster (0: no bound).
	wait time.Duration
}

func addServerFlags(fs *flag.FlagSet, defaultStore string) *serverFlags {
	f := &serverFlags{}
	fs.StringVar(&f.store, "store", filepath.Join(os.TempDir(), defaultStore), "JetStream store `directory`")
	fs.StringVar(&f.listen, "listen", "127.0.0.1:4222", "client listen address `host:port` (port 0: any free port)")
	fs.StringVar(&f.auth, "auth", "", "credentials `directory` made by 'capstan auth init': every client then needs --creds")
	fs.BoolVar(&f.insecure, "insecure", false, "listen beyond loopback without authentication (anyone who reaches the port can forge anything); for dev, also serve --mcp beyond loopback over plain HTTP")
	fs.DurationVar(&f.wait, "wait", 0, "how long to wait for the cluster to form and provisioning to succeed, retrying with a log line (0: until stopped)")
	fs.Var(&f.auditMaxAge, "audit-max-age", "how long the audit stream keeps events, a `duration` like 90d (default 30d for a new stream; unset, an existing stream keeps its own)")
	f.envelopeRetention = longDuration(broker.DefaultEnvelopeRetention)
	fs.Var(&f.envelopeRetention, "envelope-retention", "how long envelopes are kept, a `duration` like 25h or 2d (an existing bucket keeping another is changed); "+
		"requests get at most this less an hour to start, and an older execution whose envelope is gone is EXPIRED")
	f.queueMaxBytes = broker.DefaultQueueMaxBytes
	fs.Var(&f.queueMaxBytes, "queue-max-bytes", "the most bytes one principal's queue of requests holds, a `size` like 1GiB (-1: no bound); "+
		"a principal's queued-bytes quota, lower, bounds its own; a full queue refuses the next request QUOTA_EXCEEDED")
	return f
}

// minEnvelopeRetention is the shortest --envelope-retention.
const minEnvelopeRetention = time.Second

// check refuses settings no server can keep.
func (f *serverFlags) check() error {
	if time.Duration(f.envelopeRetention) < minEnvelopeRetention {
		return fmt.Errorf("--envelope-retention %v: want at least %v", time.Duration(f.envelopeRetention), minEnvelopeRetention)
	}
	return nil
}

// brokerConfig is how the embedded server's resources are provisioned.
func (f *serverFlags) brokerConfig() broker.Config {
	c := broker.Config{AuditMaxAge: time.Duration(f.auditMaxAge), EnvelopeRetention: time.Duration(f.envelopeRetention),
		QueueMaxBytes: int64(f.queueMaxBytes)}
	if f.setup != nil {
		c.Prefix = f.setup.Prefix
	}
	return c
}

func (f *serverFlags) options() (natsserver.Options, error) {
	host, port, err := hostPort("--listen", f.listen)
	if err != nil {
		return natsserver.Options{}, err
	}
	o := natsserver.Options{StoreDir: f.store, Host: host, Port: port}
	if f.auth != "" {
		if f.setup, err = auth.Load(f.auth); err != nil {
			return o, err
		}
		if err := f.setup.Current(); err != nil {
			return o, err
		}
		// Accounts signed by an earlier version get this version's crossings
		// (the configuration, read below, preloads the capstan account).
		if _, err := f.setup.Sync(); err != nil {
			return o, err
		}
		o.ConfigFile = f.setup.ServerConfigPath()
		// Each store keeps the accounts pushed to its server: the nodes of a
		// cluster on one machine share a configuration, not a directory.
		o.ResolverDir = filepath.Join(f.store, credfile.ResolverDirName)
		return o, nil
	}
	if !loopback(host) && !f.insecure {
		return o, fmt.Errorf("--listen %s reaches beyond this machine without authentication: "+
			"give --auth DIR (see 'capstan auth init'), or --insecure to accept that anyone who reaches it can act as anyone", f.listen)
	}
	return o, nil
}

// loopback reports whether host is reachable from this machine only.
func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// hostPort parses HOST:PORT; port 0 becomes natsserver's "any free port".
func hostPort(flagName, s string) (string, int, error) {
	host, p, err := net.SplitHostPort(s)
	if err != nil {
		return "", 0, fmt.Errorf("%s %q: want host:port", flagName, s)
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("%s %q: port must be 0 to 65535", flagName, s)
	}
	if port == 0 {
		port = -1
	}
	return host, port, nil
}

func newLogger(level slog.Level) *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

// signalContext ends at SIGINT or SIGTERM, which signalOf then tells; a
// second signal ends the process.
func signalContext() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(context.Background())
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	go func() {
		select {
		case sig := <-ch:
			cancel(received{sig})
		case <-ctx.Done():
		}
		signal.Stop(ch)
	}()
	return ctx, func() { signal.Stop(ch); cancel(context.Canceled) }
}

// received is the cause of a signalContext's end by a signal.
type received struct{ sig os.Signal }

func (r received) Error() string { return r.sig.String() + " signal received" }

// signalOf returns the signal that ended ctx, a signalContext's, or nil.
func signalOf(ctx context.Context) os.Signal {
	var r received
	if errors.As(context.Cause(ctx), &r) {
		return r.sig
	}
	return nil
}

// embedded is a running embedded server with capstan's and the demo's
// resources provisioned, and a connection to it.
type embedded struct {
	srv    *server.Server
	unlock func() // releases the store once the server is down
	nc     *nats.Conn
	b      *broker.Broker
	js     jetstream.JetStream
	url    string
}

// startEmbedded starts the server and provisions the resources, retrying
// until ctx ends or wait (0: no bound) passes: a clustered node can
// provision only once its peers are up.
func startEmbedded(ctx context.Context, opts natsserver.Options, bcfg broker.Config, setup *auth.Setup, wait time.Duration, log *slog.Logger) (*embedded, error) {
	start := time.Now()
	if bcfg.Logger == nil {
		bcfg.Logger = log // what provisioning changes, the envelope retention
	}
	opts.Logger = newLogger(slog.LevelWarn) // the server's notices are noise here
	unlock, err := natsserver.LockStore(opts.StoreDir)
	if err != nil {
		return nil, err
	}
	if err := portFree(opts.Host, opts.Port); err != nil {
		unlock()
		return nil, err
	}
	s, err := natsserver.Start(opts)
	if err != nil {
		unlock()
		return nil, err
	}
	e := &embedded{srv: s, url: natsserver.ClientURL(s), unlock: unlock}
	co := broker.ConnectOptions{URL: e.url, Name: "capstan server", Prefix: bcfg.Prefix}
	if setup != nil {
		co.Creds = setup.CredsPath(auth.AdminPrincipal)
	}
	e.nc, err = broker.Connect(co)
	if err != nil {
		e.stop()
		return nil, err
	}
	for {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err = nil
		if setup != nil {
			// Every account as the setup has it now, so that a principal added
			// or removed while the server was down is as the setup says.
			_, err = pushAccounts(pctx, pushOptions(e.url, setup), setup)
		}
		if err == nil {
			e.b, err = broker.Provision(pctx, e.nc, bcfg)
		}
		if err == nil {
			e.js, err = demo.Provision(pctx, e.nc, e.b.Replicas)
		}
		if err == nil && setup != nil {
			err = auth.PublishGrants(pctx, e.b.JS, setup, e.b.Replicas)
		}
		cancel()
		if err == nil {
			return e, nil
		}
		if errors.Is(err, broker.ErrConfigConflict) || ctx.Err() != nil || (wait > 0 && time.Since(start) > wait) {
			e.stop()
			return nil, err
		}
		log.Warn("waiting for the cluster: provisioning failed; retrying", "err", err)
		select {
		case <-ctx.Done():
			e.stop()
			return nil, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// portFree refuses a client port another process listens on, saying what to
// do, before the server starts (whose own error is the bind's alone).
func portFree(host string, port int) error {
	if port <= 0 {
		return nil // any free port
	}
	if host == "" {
		host = "127.0.0.1" // as the server's own default
	}
	addr := net.JoinHostPort(host, strconv.Itoa(port))
	l, err := net.Listen("tcp", addr)
	if errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Errorf("%s is in use by another process (another 'capstan dev' or 'capstan server', or a NATS server?): stop it, point your clients at it, or listen elsewhere with --listen (e.g. --listen 127.0.0.1:0, any free port)", addr)
	}
	if err != nil {
		return nil // the server says what is wrong with it
	}
	return l.Close()
}

func (e *embedded) stop() {
	if e.nc != nil {
		e.nc.Close()
	}
	e.srv.Shutdown()
	e.srv.WaitForShutdown()
	e.unlock()
}

// serverEnvironment is what the server's help says of the Go runtime's
// variables.
const serverEnvironment = `
environment:
  GOGC        the collector's target percentage; unset, the server uses 50 (its memory
              about 1.5 times its live heap, against 2 to 2.5 with Go's default 100)
  GOMEMLIMIT  a soft limit of the process's memory, e.g. 2GiB: the collector works
              harder as the heap nears it (Go's runtime reads it; no limit by default)
`

// serverGC sets the collector's target to 50 unless GOGC is set: the server's
// heap is mostly JetStream's index, and halving the headroom between
// collections costs some CPU for a third less memory. GOMEMLIMIT is honoured
// by the runtime itself.
func serverGC() {
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(50)
	}
}

func runServer(args []string) int {
	fs := newFlags("server", "[--store DIR] [--listen HOST:PORT] [--auth DIR | --insecure] [--audit-max-age D] [--envelope-retention D] [--queue-max-bytes SIZE] [--name N] [--cluster HOST:PORT] [--routes URL,URL] [--sync always|default] [--replicas N] [--pprof HOST:PORT]")
	sf := addServerFlags(fs, "capstan-server")
	name := fs.String("name", "", "server name, unique in a cluster and stable across restarts (default host-port)")
	cluster := fs.String("cluster", "", "route listen address `host:port` for a cluster (port 0: any free port)")
	routes := fs.String("routes", "", "other nodes' route URLs, comma-separated")
	syncMode := fs.String("sync", "default", "always: fsync every write before acknowledging it; default: the server's interval")
	replicas := fs.Int("replicas", 0, "replicas of the streams and buckets this server creates: 0 is auto (3 in a cluster of three or more, else 1); existing ones keep theirs, see 'capstan admin replicas'")
	pprofAddr := fs.String("pprof", "", "serve the process's Go profiles (heap, CPU, goroutines) under /debug/pprof/ on this loopback `host:port`")
	cf := addCheckpointerFlags(fs, "default: the --auth directory's audit.key, when it has one")
	metricsAddr := fs.String("metrics", "", "serve the audit checkpointer's Prometheus metrics on http://`HOST:PORT`/metrics")
	usage := fs.Usage
	fs.Usage = func() { usage(); fmt.Fprint(fs.Output(), serverEnvironment) }
	if _, code, ok := parseFlags(fs, args, 0); !ok {
		return code
	}
	if err := sf.check(); err != nil {
		return usageError("%v", err)
	}
	serverGC()
	opts, err := sf.options()
	if err != nil {
		return usageError("%v", err)
	}
	opts.Name = *name
	if *cluster != "" {
		if opts.ClusterHost, opts.ClusterPort, err = hostPort("--cluster", *cluster); err != nil {
			return usageError("%v", err)
		}
	}
	for _, r := range strings.Split(*routes, ",") {
		if r = strings.TrimSpace(r); r != "" {
			opts.Routes = append(opts.Routes, r)
		}
	}
	switch *syncMode {
	case "always":
		opts.SyncAlways = true
	case "default":
	default:
		return usageError("--sync %q: want always or default", *syncMode)
	}

	bcfg := sf.brokerConfig()
	bcfg.Replicas = *replicas
	if len(opts.Routes) > 0 {
		// This node and the ones it routes to: the cluster's size is known
		// before every peer is up, so auto does not settle for R1 early.
		bcfg.ClusterSize = len(opts.Routes) + 1
	}

	if *pprofAddr != "" {
		at, stopPprof, err := servePprof(*pprofAddr)
		if err != nil {
			return usageError("%v", err)
		}
		defer stopPprof()
		fmt.Printf("capstan server: profiles on http://%s/debug/pprof/\n", at)
	}

	log := newLogger(slog.LevelInfo)
	ctx, stop := signalContext()
	defer stop()
	e, err := startEmbedded(ctx, opts, bcfg, sf.setup, sf.wait, log)
	if err != nil {
		return fail(exitFailed, "server: %v", err)
	}
	mode := "open: no authentication"
	if sf.setup != nil {
		mode = "authentication: " + sf.auth
	}
	stopCheckpointer, signing, err := serverCheckpointer(ctx, e, cf, sf.auth, *metricsAddr, serverName(opts), log)
	if err != nil {
		e.stop()
		return fail(exitUsage, "server: %v", err)
	}
	fmt.Printf("capstan server listening on %s (store %s, %s; %s)\n", e.url, opts.StoreDir, mode, signing)
	<-ctx.Done()
	log.Info("shutting down")
	stopCheckpointer()
	e.stop()
	return exitOK
}

// serverName names a server's checkpointer: its cluster name, else its
// address.
func serverName(o natsserver.Options) string {
	if o.Name != "" {
		return o.Name
	}
	host, _ := os.Hostname()
	return fmt.Sprintf("%s-%d", host, os.Getpid())
}

// serverCheckpointer runs the audit log's checkpointer beside the server
// when it has a signing key, with its metrics on metricsAddr when set. It
// returns what stops it and a phrase for the ready line.
func serverCheckpointer(ctx context.Context, e *embedded, cf *checkpointerFlags, authDir, metricsAddr, name string, log *slog.Logger) (func(), string, error) {
	keyPath, err := serverAuditKey(cf, authDir)
	if err != nil {
		return nil, "", err
	}
	if keyPath == "" {
		if metricsAddr != "" {
			return nil, "", errors.New("--metrics: the server serves its audit checkpointer's metrics, and it has no --audit-key")
		}
		return func() {}, "audit log not signed here: no --audit-key (make one with 'capstan audit keygen')", nil
	}
	var reg prometheus.Registerer
	if metricsAddr != "" {
		tel := telemetry.New(telemetry.Options{})
		addr, _, err := tel.Serve(ctx, metricsAddr)
		if err != nil {
			return nil, "", fmt.Errorf("--metrics: %w", err)
		}
		reg = tel.Registry()
		log.Info("metrics served", "url", fmt.Sprintf("http://%s/metrics", addr))
	}
	c, err := startCheckpointer(e.b, keyPath, trail.Config{Interval: cf.interval, Name: name, Log: log}, reg)
	if err != nil {
		return nil, "", fmt.Errorf("--audit-key: %w", err)
	}
	return c.stop, "audit log signed with " + keyPath, nil
}
