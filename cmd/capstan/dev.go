package main

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/capstan-dev/capstan/auth"
	"github.com/capstan-dev/capstan/console"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/trail"
	"github.com/capstan-dev/capstan/mcpbridge"
)

func runDev(args []string) int {
	fs := newFlags("dev", "[--store DIR] [--listen HOST:PORT] [--auth DIR] [--console HOST:PORT] [--mcp HOST:PORT] [--notify FILE] [--audit-max-age D] [--envelope-retention D] [--queue-max-bytes SIZE] [worker flags]")
	sf := addServerFlags(fs, "capstan-dev")
	wf := addWorkerFlags(fs)
	fs.StringVar(&wf.capabilities, "capabilities", "", "serve only these demo capabilities, comma-separated (default: all; demo.echo among them)")
	consoleAddr := fs.String("console", defaultConsole, "the web console's address, on loopback (\"off\": no console)")
	mcpAddr := fs.String("mcp", "", "also serve the catalog as MCP tools over streamable HTTP on `host:port` (unset or \"off\": not served)")
	mf := addMCPFlags(fs, "mcp-")
	cf := addCheckpointerFlags(fs, "default: the --auth directory's audit.key, else a development key in the store")
	if _, code, ok := parseFlags(fs, args, 0); !ok {
		return code
	}
	if err := sf.check(); err != nil {
		return usageError("%v", err)
	}
	if err := mf.check(); err != nil {
		return usageError("%v", err)
	}
	if wf.capabilities != "" && !slices.Contains(strings.Split(strings.ReplaceAll(wf.capabilities, " ", ""), ","), "demo.echo") {
		return usageError("--capabilities: dev serves demo.echo, and waits for it to be served")
	}
	notifyCfg, err := loadNotify(wf.notify)
	if err != nil {
		return usageError("%v", err)
	}
	opts, err := sf.options()
	if err != nil {
		return usageError("%v", err)
	}
	if *mcpAddr == "off" {
		*mcpAddr = "" // as --console off reads
	}
	if *mcpAddr != "" {
		if err := mf.checkListen("--mcp", *mcpAddr, sf.insecure); err != nil {
			return usageError("%v", err)
		}
	}
	log := newLogger(slog.LevelInfo)
	ctx, stop := signalContext()
	defer stop()

	bcfg := sf.brokerConfig()
	bcfg.Replicas = wf.replicas
	bcfg.RecordWindow = wf.recordWindow
	e, err := startEmbedded(ctx, opts, bcfg, sf.setup, sf.wait, log)
	if err != nil {
		return fail(exitFailed, "dev: %v", err)
	}
	defer e.stop()
	wnc, wjs := e.nc, e.js
	if sf.setup != nil {
		// The demo worker connects as the worker principal, as a real one does.
		wnc, err = broker.Connect(broker.ConnectOptions{URL: e.url, Name: "capstan dev worker",
			Creds: sf.setup.CredsPath(auth.WorkerPrincipal), Prefix: sf.setup.Prefix})
		if err != nil {
			return fail(exitFailed, "dev: %v", err)
		}
		defer wnc.Close()
		if wjs, err = jetstream.New(wnc); err != nil {
			return fail(exitFailed, "dev: %v", err)
		}
	}
	tel, stopTelemetry, err := startTelemetry(ctx, "capstan-dev", wf.metrics, e.b, log)
	if err != nil {
		return fail(exitFailed, "dev: %v", err)
	}
	defer stopTelemetry()
	if tel != nil {
		wf.observer = tel.Worker()
	}
	w, ids, err := newDemoWorker(wnc, wjs, wf, log)
	if err != nil {
		return fail(exitFailed, "dev: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	// The ready line below is printed once the demo worker serves: a call
	// typed the moment it shows is listed and run.
	select {
	case <-w.Ready():
	case err := <-done:
		if err == nil {
			err = ctx.Err()
		}
		return fail(exitFailed, "dev: %v", err)
	}

	keyPath, err := devAuditKey(cf, sf.auth, opts.StoreDir)
	if err != nil {
		stop()
		<-done
		return fail(exitFailed, "dev: %v", err)
	}
	if keyPath != "" {
		var reg prometheus.Registerer
		if tel != nil && wf.metrics != "" {
			reg = tel.Registry()
		}
		c, err := startCheckpointer(e.b, keyPath, trail.Config{Interval: cf.interval, Name: "capstan-dev", Log: log}, reg)
		if err != nil {
			stop()
			<-done
			return fail(exitFailed, "dev: --audit-key: %v", err)
		}
		defer c.stop()
		fmt.Printf("audit log: signed with %s; verify with: capstan audit verify --key %s\n", keyPath,
			filepath.Join(filepath.Dir(keyPath), trail.PublicKeyFile))
	}

	natsFlag := ""
	if e.url != broker.DefaultURL {
		natsFlag = " --nats " + e.url
	}
	if sf.setup != nil {
		natsFlag += " --creds " + sf.setup.CredsPath("NAME")
		fmt.Printf("authentication: %s (principals: capstan auth list %s)\n", sf.auth, sf.auth)
	}
	consoleCfg := console.Config{Open: true, Conn: e.nc, Logger: log}
	if sf.setup != nil {
		// With authentication, principals sign in with their credentials.
		consoleCfg = console.Config{NATS: executor.ConnectOptions{URL: e.url}, Deployment: executor.Deployment{Prefix: sf.setup.Prefix}, Logger: log}
	}
	if keyPath != "" {
		if keys, err := os.ReadFile(filepath.Join(filepath.Dir(keyPath), trail.PublicKeyFile)); err == nil {
			consoleCfg.AuditKeys = string(keys)
		}
	}
	consoleURL, consoleDone := startDevConsole(ctx, *consoleAddr, consoleCfg, log)
	// quit ends dev on an error once the workers and the console stopped.
	quit := func(format string, err error) int {
		stop()
		<-done
		if consoleDone != nil {
			<-consoleDone
		}
		return fail(exitFailed, format, err)
	}
	if notifyCfg != nil && notifyCfg.ConsoleURL == "" {
		notifyCfg.ConsoleURL = consoleURL // messages link to this console
	}
	stopNotifier, err := startNotifier(ctx, wnc, notifyCfg, tel, log)
	if err != nil {
		return quit("dev: --notify: %v", err)
	}
	defer stopNotifier()
	fmt.Printf("capstan dev listening on %s (store %s), serving %s\n", e.url, opts.StoreDir, strings.Join(ids, ", "))
	if consoleURL != "" {
		fmt.Printf("console: %s\n", consoleURL)
	}
	fmt.Printf("try:\n  capstan call demo.echo%s --input '{\"hello\":\"world\"}'\n", natsFlag)
	if *mcpAddr != "" {
		srv, token, err := startDevMCP(e.nc, *mcpAddr, mf, log)
		if err != nil {
			return quit("dev: mcp: %v", err)
		}
		defer func() { _ = srv.stop() }()
		fmt.Printf("MCP (streamable HTTP) on %s\n", srv.url)
		if token != "" {
			fmt.Printf("  bearer token for %s: %s\n", defaultActor(&connFlags{}), token)
		}
	}

	err = <-done
	if consoleDone != nil {
		stop() // the worker has stopped: so does the console
		<-consoleDone
	}
	if err != nil {
		return fail(exitFailed, "dev: worker: %v", err)
	}
	return exitOK
}

// startDevMCP serves the bridge for dev: with the tokens of --mcp-tokens, or
// else one new token for the default actor, returned to be printed.
func startDevMCP(nc *nats.Conn, addr string, mf *mcpFlags, log *slog.Logger) (*mcpServer, string, error) {
	var tokens *mcpbridge.Tokens
	var token string
	var err error
	if mf.tokens != "" {
		tokens, err = mf.readTokens()
	} else {
		var a envelope.Actor
		if a, err = parseActor(defaultActor(&connFlags{})); err == nil {
			token = newToken()
			tokens, err = mcpbridge.NewTokens(map[string]envelope.Actor{token: a})
		}
	}
	if err != nil {
		return nil, "", err
	}
	srv, err := startMCPHTTP(nc, addr, tokens, mf, log)
	return srv, token, err
}

// devAuditKey is the key dev signs the audit log with: --audit-key's, the
// --auth directory's, else a development key made once in the store (so
// that a restarted dev keeps its log).
func devAuditKey(cf *checkpointerFlags, authDir, store string) (string, error) {
	p, err := serverAuditKey(cf, authDir)
	if err != nil || p != "" || cf.key == "off" {
		return p, err
	}
	dir := filepath.Join(store, "audit-key")
	p = filepath.Join(dir, trail.KeyFile)
	if _, err := os.Stat(p); err == nil {
		return p, nil
	}
	if _, err := trail.Keygen(dir, trail.DefaultOrigin("capstan-dev")); err != nil {
		return "", fmt.Errorf("development audit key: %w", err)
	}
	return p, nil
}
