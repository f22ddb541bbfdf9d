package main

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/mcpbridge"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"
)

// mcpPath is where the streamable HTTP endpoint is served.
const mcpPath = "/mcp"

// mcpFlags configure the MCP bridge of mcp and dev.
type mcpFlags struct {
	tokens              string
	callTimeout         time.Duration
	approvalWait        time.Duration
	stateless           bool
	toolNames           string
	httpsCert, httpsKey string
	prefix              string
}

func addMCPFlags(fs *flag.FlagSet, prefix string) *mcpFlags {
	f := &mcpFlags{prefix: prefix}
	fs.StringVar(&f.tokens, prefix+"tokens", "", "bearer tokens `file` for HTTP, one \"TOKEN kind:id\" per line (readable by its owner only)")
	fs.StringVar(&f.httpsCert, prefix+"https-cert", "", "serve HTTPS with this certificate `file` (with --"+prefix+"https-key)")
	fs.StringVar(&f.httpsKey, prefix+"https-key", "", "the HTTPS certificate's key `file`")
	fs.DurationVar(&f.callTimeout, prefix+"call-timeout", 5*time.Minute, "how long a tools/call waits for its envelope")
	fs.DurationVar(&f.approvalWait, prefix+"approval-wait", 0, "how long a call that needs an approval waits for it before answering approval-required")
	fs.BoolVar(&f.stateless, prefix+"stateless", false, "HTTP without sessions, protocol 2026-07-28 and later (any bridge answers any request)")
	fs.StringVar(&f.toolNames, prefix+"tool-names", string(mcpbridge.ToolNamesPortable),
		"how capabilities are named as tools: portable (orders_refund: what the Anthropic and OpenAI APIs take) or ids (orders.refund)")
	return f
}

func (f *mcpFlags) check() error {
	switch mcpbridge.ToolNames(f.toolNames) {
	case mcpbridge.ToolNamesPortable, mcpbridge.ToolNamesCapabilityIDs:
		return nil
	}
	return fmt.Errorf("--tool-names %q: want portable or ids", f.toolNames)
}

func (f *mcpFlags) config(log *slog.Logger) mcpbridge.Config {
	return mcpbridge.Config{Name: "capstan", Version: "dev", CallTimeout: f.callTimeout, ApprovalWait: f.approvalWait,
		ToolNames: mcpbridge.ToolNames(f.toolNames), Logger: log}
}

func (f *mcpFlags) readTokens() (*mcpbridge.Tokens, error) {
	if f.tokens == "" {
		return nil, errors.New("--tokens is required with --http: without a bearer token, no tools")
	}
	if err := broker.CheckPrivate(f.tokens); err != nil {
		return nil, fmt.Errorf("--%stokens: %w", f.prefix, err)
	}
	r, err := os.Open(f.tokens)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return mcpbridge.ParseTokens(r)
}

func runMCP(args []string) int {
	fs := newFlags("mcp", "[--actor kind:id] | --http HOST:PORT --tokens FILE; [--print-config [--config-format claude|vscode]]")
	conn := addConnFlags(fs)
	mf := addMCPFlags(fs, "")
	actor := fs.String("actor", "", "over stdio, who every call runs for, as kind:id (default: user:<principal> with --creds, else user:$USER)")
	addr := fs.String("http", "", "serve streamable HTTP on `host:port` instead of stdio")
	insecure := fs.Bool("insecure", false, "serve plain HTTP beyond loopback (bearer tokens travel in clear: anyone on the path can replay them)")
	printConfig := fs.Bool("print-config", false, "print the configuration that makes a desktop host or an IDE run this command (absolute paths), and exit")
	format := fs.String("config-format", "claude", "with --print-config: claude (Claude Desktop, Claude Code, Cursor: \"mcpServers\") or vscode (\"servers\")")
	if _, code, ok := parseFlags(fs, args, 0); !ok {
		return code
	}
	if err := mf.check(); err != nil {
		return usageError("%v", err)
	}
	if *printConfig {
		return printMCPConfig(fs, conn, *addr, *format)
	}
	// stdout is the protocol over stdio: logs go to stderr only.
	log := newLogger(slog.LevelInfo)
	var tokens *mcpbridge.Tokens
	var a envelope.Actor
	var err error
	if *addr != "" {
		if err := mf.checkListen("--http", *addr, *insecure); err != nil {
			return usageError("%v", err)
		}
		if tokens, err = mf.readTokens(); err != nil {
			return usageError("%v", err)
		}
	} else {
		if *actor == "" {
			*actor = defaultActor(conn)
		}
		if a, err = parseActor(*actor); err != nil || a.ID == "" {
			return usageError("--actor %q: want kind:id, e.g. user:alice", *actor)
		}
	}
	nc, err := conn.connectServing("mcp")
	if err != nil {
		return usageError("%v", err)
	}
	defer nc.Close()
	ctx, stop := signalContext()
	defer stop()

	if *addr == "" {
		err = serveMCPStdio(ctx, nc, mf.config(log), a)
	} else {
		var srv *mcpServer
		srv, err = startMCPHTTP(nc, *addr, tokens, mf, log)
		if err == nil {
			log.Info("capstan mcp serving streamable HTTP", "url", srv.url)
			<-ctx.Done()
			err = srv.stop()
		}
	}
	if err != nil {
		return fail(exitFailed, "mcp: %v", err)
	}
	return exitOK
}

// serveMCPStdio serves one actor over stdin and stdout until ctx ends or the
// host closes stdin.
func serveMCPStdio(ctx context.Context, nc *nats.Conn, cfg mcpbridge.Config, actor envelope.Actor) error {
	b, err := mcpbridge.New(nc, cfg)
	if err != nil {
		return err
	}
	defer b.Close()
	s, err := b.Server(ctx, actor)
	if err != nil {
		return err
	}
	err = s.Run(ctx, mcpbridge.TasksTransport(&mcp.StdioTransport{}))
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// mcpServer is a bridge served over streamable HTTP.
type mcpServer struct {
	url    string
	bridge *mcpbridge.Bridge
	http   *http.Server
	done   chan error
}

// checkListen refuses to serve bearer tokens over plain HTTP beyond
// loopback, unless insecure: they would travel in clear to anyone on the
// path. flagName names the address's flag in the message.
func (f *mcpFlags) checkListen(flagName, addr string, insecure bool) error {
	if (f.httpsCert == "") != (f.httpsKey == "") {
		return fmt.Errorf("--%shttps-cert and --%shttps-key go together", f.prefix, f.prefix)
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%s %q: want host:port", flagName, addr)
	}
	if f.httpsCert != "" || loopback(host) || insecure {
		return nil
	}
	return fmt.Errorf("%s %s serves bearer tokens over plain HTTP beyond this machine: "+
		"give --%shttps-cert and --%shttps-key, listen on loopback behind a TLS proxy, "+
		"or --insecure to accept that anyone on the path can read and replay them", flagName, addr, f.prefix, f.prefix)
}

// startMCPHTTP serves the bridge on addr until stop, over HTTPS when mf
// names a certificate.
func startMCPHTTP(nc *nats.Conn, addr string, tokens *mcpbridge.Tokens, mf *mcpFlags, log *slog.Logger) (*mcpServer, error) {
	scheme := "http"
	var tlsConfig *tls.Config
	if mf.httpsCert != "" {
		cert, err := tls.LoadX509KeyPair(mf.httpsCert, mf.httpsKey)
		if err != nil {
			return nil, fmt.Errorf("--%shttps-cert: %w", mf.prefix, err)
		}
		tlsConfig, scheme = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, "https"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--http: %w", err)
	}
	if tlsConfig != nil {
		ln = tls.NewListener(ln, tlsConfig)
	}
	b, err := mcpbridge.New(nc, mf.config(log))
	if err != nil {
		_ = ln.Close()
		return nil, err
	}
	// Each caller's tool list now: a tool name two capabilities would share
	// is refused at start, not at the first call.
	for _, a := range tokens.Actors() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, err := b.Server(ctx, a)
		cancel()
		if errors.Is(err, mcpbridge.ErrToolNameCollision) {
			_ = b.Close()
			_ = ln.Close()
			return nil, err
		}
	}
	mux := http.NewServeMux()
	mux.Handle(mcpPath, b.Handler(tokens, &mcpbridge.HTTPOptions{Stateless: mf.stateless}))
	s := &mcpServer{url: scheme + "://" + ln.Addr().String() + mcpPath, bridge: b, done: make(chan error, 1),
		http: &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}}
	go func() { s.done <- s.http.Serve(ln) }()
	return s, nil
}

// stop lets the calls in flight end (at most 10 s: their executions go on,
// their results stay readable), then closes the sessions and the bridge.
func (s *mcpServer) stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.http.Shutdown(ctx); err != nil {
		// The server ends the requests still open, not their clients: their
		// executions must not be cancelled as a stateless client's would.
		s.bridge.BeginClose()
		_ = s.http.Close() // streams that never end on their own
	}
	err := <-s.done
	_ = s.bridge.Close()
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// newToken returns a random bearer token.
func newToken() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// printMCPConfig prints what a desktop host or an IDE needs to run this very
// command over stdio: the absolute path of this binary, and the flags given
// with every file made absolute, without --print-config. A desktop app
// starts it without the shell's PATH or working directory.
func printMCPConfig(fs *flag.FlagSet, conn *connFlags, httpAddr, format string) int {
	if format != "claude" && format != "vscode" {
		return usageError("--config-format %q: want claude or vscode", format)
	}
	exe, err := os.Executable()
	if err != nil {
		return fail(exitFailed, "the path of this binary: %v", err)
	}
	if p, err := filepath.EvalSymlinks(exe); err == nil {
		exe = p
	}
	if strings.Contains(exe, string(filepath.Separator)+"go-build") {
		fmt.Fprintf(os.Stderr, "capstan: %s is a temporary binary of 'go run': install capstan ('go install ./cmd/capstan') and print the configuration with it\n", exe)
	}
	var server map[string]any
	if httpAddr != "" {
		server = map[string]any{"type": "http", "url": "http://" + httpAddr + mcpPath,
			"headers": map[string]string{"Authorization": "Bearer TOKEN (a line of the --tokens file)"}}
	} else {
		out := []string{"mcp"}
		files := map[string]bool{"creds": true, "tls-ca": true, "tls-cert": true, "tls-key": true, "tokens": true}
		skip := map[string]bool{"print-config": true, "config-format": true}
		// The flags given, as the flag set parsed them: a switch stays a
		// switch, and a value is the one that took effect.
		fs.Visit(func(f *flag.Flag) {
			if skip[f.Name] {
				return
			}
			value := f.Value.String()
			if isSwitch(f) {
				if value == "true" {
					out = append(out, "--"+f.Name)
				} else {
					out = append(out, "--"+f.Name+"="+value)
				}
				return
			}
			if files[f.Name] {
				if abs, err := filepath.Abs(value); err == nil {
					value = abs
				}
			}
			out = append(out, "--"+f.Name, value)
		})
		if !slices.Contains(out, "--nats") {
			// What this command connects to now, written down: the host's
			// environment has no CAPSTAN_NATS_URL.
			out = append(out, "--nats", (&broker.ConnectOptions{URL: conn.url}).ResolveURL())
		}
		server = map[string]any{"command": exe, "args": out}
		if format == "vscode" {
			server["type"] = "stdio"
		}
	}
	key := "mcpServers"
	if format == "vscode" {
		key = "servers"
	}
	if code := printJSON(map[string]any{key: map[string]any{"capstan": server}}); code != exitOK {
		return code
	}
	if isTerminal(os.Stderr) {
		where := "Claude Desktop: claude_desktop_config.json (macOS: ~/Library/Application Support/Claude/, Windows: %APPDATA%\\Claude\\); Claude Code and Cursor: .mcp.json"
		if format == "vscode" {
			where = "VS Code: .vscode/mcp.json"
		}
		fmt.Fprintf(os.Stderr, "capstan: merge this into %s\n", where)
	}
	return exitOK
}

// isSwitch reports whether f is a switch (--insecure, not --insecure VALUE).
func isSwitch(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}
