package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"

	"github.com/capstan-dev/capstan/console"
	"github.com/capstan-dev/capstan/internal/broker"
)

// defaultConsole is where `capstan dev` serves its console.
const defaultConsole = "127.0.0.1:8233"

func runConsole(args []string) int {
	fs := newFlags("console", "[--listen HOST:PORT] [--https-cert FILE --https-key FILE] [--open] [--insecure] [--admins kind:id,...] [--allow-hosts NAME,...]")
	conn := addConnFlags(fs)
	listen := fs.String("listen", defaultConsole, "the console's HTTP address")
	open := fs.Bool("open", false, "no credentials at sign-in: the form names the approver and every session uses this process's connection (loopback only)")
	insecure := fs.Bool("insecure", false, "allow listening beyond loopback open or without HTTPS")
	httpsCert := fs.String("https-cert", "", "serve HTTPS with this certificate `file` (with --https-key)")
	httpsKey := fs.String("https-key", "", "the HTTPS certificate's key `file`")
	admins := fs.String("admins", "", "principals, as kind:id separated by commas, who may cancel any execution")
	auditPub := fs.String("audit-key", "", "the audit log's public key `file` (audit.pub): an execution's page shows its trail verifies against the latest checkpoint with it (default: the key the deployment states)")
	allowHosts := fs.String("allow-hosts", "", "more host names, separated by commas (*.example.com for any one label in front), under which browsers reach the console; requests naming any other host are refused (beside --listen's host, the HTTPS certificate's names, and on loopback localhost)")
	if _, code, ok := parseFlags(fs, args, 0); !ok {
		return code
	}
	if (*httpsCert == "") != (*httpsKey == "") {
		return usageError("--https-cert and --https-key go together")
	}
	if err := console.ListenAddr(*listen, *open, *httpsCert != "", *insecure); err != nil {
		return usageError("%v", err)
	}
	natsTLS, err := clientTLS(conn.tlsCert, conn.tlsKey)
	if err != nil {
		return usageError("console: %v", err)
	}
	cfg := console.Config{
		Open: *open, Logger: newLogger(slog.LevelInfo),
		NATS: broker.ConnectOptions{URL: conn.url, TLS: natsTLS, TLSCA: conn.tlsCA},
	}
	if *auditPub != "" {
		keys, err := os.ReadFile(*auditPub)
		if err != nil {
			return usageError("--audit-key: %v", err)
		}
		cfg.AuditKeys = string(keys)
	}
	// The names browsers may reach the console by: --listen's, the
	// certificate's and --allow-hosts.
	if host, _, err := net.SplitHostPort(*listen); err == nil && host != "" {
		cfg.AllowedHosts = append(cfg.AllowedHosts, host)
	}
	var tlsConfig *tls.Config
	if *httpsCert != "" {
		cert, err := tls.LoadX509KeyPair(*httpsCert, *httpsKey)
		if err != nil {
			return usageError("console: %v", err)
		}
		tlsConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		if cert.Leaf != nil {
			cfg.AllowedHosts = append(cfg.AllowedHosts, cert.Leaf.DNSNames...)
			for _, ip := range cert.Leaf.IPAddresses {
				cfg.AllowedHosts = append(cfg.AllowedHosts, ip.String())
			}
		}
	}
	for h := range strings.SplitSeq(*allowHosts, ",") {
		if h = strings.TrimSpace(h); h != "" {
			cfg.AllowedHosts = append(cfg.AllowedHosts, h)
		}
	}
	for a := range strings.SplitSeq(*admins, ",") {
		if a = strings.TrimSpace(a); a != "" {
			cfg.Admins = append(cfg.Admins, a)
		}
	}
	if *open {
		nc, err := conn.connectServing("console")
		if err != nil {
			return usageError("%v", err)
		}
		defer nc.Close()
		if nc.AuthRequired() {
			// Everyone signing in would act with this process's credentials.
			return usageError("console: --open is for servers without authentication; principals sign in with their own credentials")
		}
		cfg.Conn = nc
	}
	ctx, stop := signalContext()
	defer stop()
	l, err := net.Listen("tcp", *listen)
	if err != nil {
		return usageError("console: %v", err)
	}
	scheme := "http"
	if tlsConfig != nil {
		l, scheme = tls.NewListener(l, tlsConfig), "https"
	}
	mode := "sign in with a principal's credentials"
	if *open {
		mode = "open: sign in by naming yourself"
	}
	fmt.Printf("capstan console on %s://%s (%s)\n", scheme, l.Addr(), mode)
	if err := serveConsole(ctx, l, cfg); err != nil {
		return fail(exitFailed, "console: %v", err)
	}
	return exitOK
}

func serveConsole(ctx context.Context, l net.Listener, cfg console.Config) error {
	c, err := console.New(cfg)
	if err != nil {
		_ = l.Close()
		return err
	}
	return c.Serve(ctx, l)
}

// startDevConsole serves the console of `capstan dev` on addr (loopback) and
// returns its URL; a console that cannot listen is a warning, not a reason to
// stop the server.
func startDevConsole(ctx context.Context, addr string, cfg console.Config, log *slog.Logger) (url string, done <-chan error) {
	if addr == "" || addr == "off" {
		return "", nil
	}
	if err := console.ListenAddr(addr, true, false, false); err != nil {
		log.Warn("console not started", "err", err)
		return "", nil
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		log.Warn("console not started", "err", err)
		return "", nil
	}
	ch := make(chan error, 1)
	go func() { ch <- serveConsole(ctx, l, cfg) }()
	return "http://" + l.Addr().String(), ch
}
