package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/credfile"
)

// connFlags are the connection flags of every networked command.
type connFlags struct {
	url, creds, tlsCA, tlsCert, tlsKey string

	// The --creds file as read, once (see credentials).
	credsRead bool
	cred      *credfile.Credentials
	credErr   error
}

// credentials reads the --creds file once for the whole command: every use
// (the inbox prefix and the connection's authentication, the role a refusal
// names, the default actor) takes this value. nil without --creds; a file
// that cannot be read, or that others may read, is the error the connection
// reports.
func (c *connFlags) credentials() (*credfile.Credentials, error) {
	if !c.credsRead && c.creds != "" {
		c.credsRead = true
		c.cred, c.credErr = credfile.Read(c.creds)
	}
	return c.cred, c.credErr
}

func addConnFlags(fs *flag.FlagSet) *connFlags {
	c := &connFlags{}
	fs.StringVar(&c.url, "nats", "", "NATS server URL, or several separated by commas (default $CAPSTAN_NATS_URL or "+broker.DefaultURL+")")
	fs.StringVar(&c.creds, "creds", "", "NATS credentials `file`")
	fs.StringVar(&c.tlsCA, "tls-ca", "", "CA certificate `file` that signed the server's certificate")
	fs.StringVar(&c.tlsCert, "tls-cert", "", "client certificate `file` (with --tls-key)")
	fs.StringVar(&c.tlsKey, "tls-key", "", "client key `file` (with --tls-cert)")
	return c
}

// connect opens the command's connection. A URL of another scheme, an
// address where nothing listens and a port that does not speak NATS are
// each named as such, with what to do; a publish the server refuses ends the
// command at once, naming the role and the subject, rather than letting a
// request wait for its timeout.
func (c *connFlags) connect(name string) (*nats.Conn, error) {
	nc, err := c.connectServing(name)
	if err != nil {
		return nil, err
	}
	p := c.principal()
	nc.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if !errors.Is(err, nats.ErrPermissionViolation) {
			return
		}
		who := "these credentials"
		if p.known() {
			who = fmt.Sprintf("%s %q", p.role, p.name)
		}
		if isTerminal(os.Stderr) {
			fmt.Fprint(os.Stderr, "\r\x1b[K")
		}
		os.Exit(fail(exitUsage, "the server refused what %s may not do: %v", who, err))
	})
	return nc, nil
}

// open checks that the principal may do right (see need), connects, and
// gives the request a context of submitTimeout; done closes both.
func (c *connFlags) open(name, right string, subject func(principal string) string, hint string) (nc *nats.Conn, ctx context.Context, done func(), err error) {
	if err := c.need(right, subject, hint); err != nil {
		return nil, nil, nil, err
	}
	if nc, err = c.connect(name); err != nil {
		return nil, nil, nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), submitTimeout)
	return nc, ctx, func() { cancel(); nc.Close() }, nil
}

// openJS connects a command that reads or writes capstan's buckets itself
// (pause, policy, limits) and gives it a context of timeout; done closes
// both.
func (c *connFlags) openJS(name string, timeout time.Duration) (js jetstream.JetStream, ctx context.Context, done func(), err error) {
	nc, err := c.connect(name)
	if err != nil {
		return nil, nil, nil, err
	}
	if js, err = jetstream.New(nc); err != nil {
		nc.Close()
		return nil, nil, nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	return js, ctx, func() { cancel(); nc.Close() }, nil
}

// readBuckets parses the args of a command that reads capstan's buckets
// itself and takes no argument, as parseOutput does, then connects it as
// openJS does, for submitTimeout; done is nil when the command ends with
// code.
func (c *connFlags) readBuckets(name string, fs *flag.FlagSet, args []string, o *outputFlags) (js jetstream.JetStream, ctx context.Context, done func(), code int) {
	if _, code, ok := parseOutput(fs, args, 0, o); !ok {
		return nil, nil, nil, code
	}
	js, ctx, done, err := c.openJS(name, submitTimeout)
	if err != nil {
		return nil, nil, nil, usageError("%v", err)
	}
	return js, ctx, done, exitOK
}

// unlessAbsent reads a bucket that is created on first use (the pauses and
// the policies by an admin's first change, the limits by a worker) as none,
// nil, until then.
func unlessAbsent(kv jetstream.KeyValue, err error) (jetstream.KeyValue, error) {
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, nil
	}
	return kv, err
}

// connectServing opens the connection of a command that serves (mcp,
// console): checked and explained as connect's, but a refused publish is
// the served request's to answer, not the end of the process.
func (c *connFlags) connectServing(name string) (*nats.Conn, error) {
	o, err := c.options(name)
	if err != nil {
		return nil, err
	}
	url := o.ResolveURL()
	if err := checkURLs(url); err != nil {
		return nil, err
	}
	if _, err := c.credentials(); err != nil {
		return nil, err
	}
	if g := newGreeter(url, o.Timeout); g != nil {
		o.Dialer = g
	}
	nc, err := broker.Connect(o)
	if nn := (*notNATSError)(nil); errors.As(err, &nn) {
		return nil, nn
	}
	if err != nil {
		return nil, explainConnect(url, err)
	}
	return nc, nil
}

// checkURLs refuses a URL no NATS client can use: NATS speaks nats://,
// tls://, ws:// or wss://, or host:port.
func checkURLs(urls string) error {
	for _, u := range strings.Split(urls, ",") {
		u = strings.TrimSpace(u)
		scheme, _, ok := strings.Cut(u, "://")
		if !ok {
			continue
		}
		switch strings.ToLower(scheme) {
		case "nats", "tls", "ws", "wss":
		case "http", "https":
			return fmt.Errorf("%s is a web address, not a NATS server's: NATS URLs begin nats:// (e.g. %s); the console's address is not the NATS server's",
				broker.RedactURL(u), broker.DefaultURL)
		default:
			return fmt.Errorf("%s: NATS URLs begin nats://, tls://, ws:// or wss:// (e.g. %s), not %s://", broker.RedactURL(u), broker.DefaultURL, scheme)
		}
	}
	return nil
}

// probeWait bounds how long the first connection waits for a NATS server's
// greeting, which a server sends as soon as it accepts a connection.
const probeWait = 1500 * time.Millisecond

// greeter dials the command's connection to a single plain URL. The first
// connection it opens must greet as a NATS server does (INFO) within
// probeWait: nothing NATS listening there (the console's HTTP port, another
// protocol) is said at once, on that same connection, rather than after the
// client's timeout; the greeting read is handed on to the client. A
// reconnect dials as the client would. A cluster's several URLs, TLS and
// websockets are left to the client.
type greeter struct {
	url     string
	timeout time.Duration
	greeted atomic.Bool
}

func newGreeter(url string, timeout time.Duration) *greeter {
	if strings.Contains(url, ",") {
		return nil
	}
	if scheme, _, ok := strings.Cut(url, "://"); ok && strings.ToLower(scheme) != "nats" {
		return nil
	}
	return &greeter{url: url, timeout: timeout}
}

// Dial implements nats.CustomDialer.
func (g *greeter) Dial(network, addr string) (net.Conn, error) {
	conn, err := net.DialTimeout(network, addr, g.timeout)
	if err != nil || g.greeted.Load() {
		return conn, err // nothing listening: the client says it, and explainConnect explains
	}
	_ = conn.SetDeadline(time.Now().Add(probeWait))
	buf := make([]byte, 5)
	n, _ := io.ReadFull(conn, buf)
	if n >= 4 && string(buf[:4]) == "INFO" {
		_ = conn.SetDeadline(time.Time{})
		g.greeted.Store(true)
		return &greetedConn{Conn: conn, r: io.MultiReader(bytes.NewReader(buf[:n]), conn)}, nil
	}
	what := "sends no NATS greeting"
	if n > 0 {
		what = fmt.Sprintf("greets with %q, not a NATS server's INFO", buf[:n])
	} else if speaksHTTP(conn) {
		what = "speaks HTTP, not NATS (is it the console's address? capstan's console serves 127.0.0.1:8233 by default, NATS 4222)"
	}
	_ = conn.Close()
	return nil, &notNATSError{fmt.Sprintf("capstan: %s %s: give the NATS server's address with --nats URL or CAPSTAN_NATS_URL (default %s)",
		broker.RedactURL(g.url), what, broker.DefaultURL)}
}

// greetedConn replays the greeting the dialer read, then reads the
// connection.
type greetedConn struct {
	net.Conn
	r io.Reader
}

func (c *greetedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// notNATSError: what listens at the URL is not a NATS server.
type notNATSError struct{ msg string }

func (e *notNATSError) Error() string { return e.msg }

// speaksHTTP reports whether the silent server at the other end of conn
// answers an HTTP request.
func speaksHTTP(conn net.Conn) bool {
	_ = conn.SetDeadline(time.Now().Add(probeWait))
	if _, err := io.WriteString(conn, "HEAD / HTTP/1.0\r\n\r\n"); err != nil {
		return false
	}
	buf := make([]byte, 5)
	n, _ := io.ReadFull(conn, buf)
	return n == 5 && string(buf) == "HTTP/"
}

// explainConnect says what a failed connection tried and what to do.
func explainConnect(url string, err error) error {
	switch {
	case errors.Is(err, nats.ErrNoServers):
		return fmt.Errorf("%w\nNo NATS server answers at %s. Start one with 'capstan dev' (a server and a demo worker) or 'capstan server', "+
			"or point at yours with --nats URL or CAPSTAN_NATS_URL", err, broker.RedactURL(url))
	case errors.Is(err, nats.ErrAuthorization), errors.Is(err, nats.ErrAuthExpired), errors.Is(err, nats.ErrAuthRevoked):
		return fmt.Errorf("%w\nThe server at %s refused these credentials: give a principal's with --creds FILE (capstan auth add writes them)",
			err, broker.RedactURL(url))
	}
	return err
}

// connectWait connects a process that serves (worker, notifier,
// checkpointer), waiting up to wait for a server to answer; when ctx ends
// first (the process was stopped), the error is ctx's.
func (c *connFlags) connectWait(ctx context.Context, name string, wait time.Duration, log *slog.Logger) (*nats.Conn, error) {
	o, err := c.options(name)
	if err != nil {
		return nil, err
	}
	return broker.ConnectWait(ctx, o, wait, log)
}

func (c *connFlags) options(name string) (broker.ConnectOptions, error) {
	tc, err := clientTLS(c.tlsCert, c.tlsKey)
	o := broker.ConnectOptions{
		URL: c.url, Creds: c.creds, TLS: tc, TLSCA: c.tlsCA,
		Name: "capstan " + name, Timeout: 5 * time.Second,
	}
	if cr, cerr := c.credentials(); cerr == nil && cr != nil {
		o.Credentials = cr.Credentials
	}
	return o, err
}

// clientTLS is the TLS configuration of --tls-cert and --tls-key, nil
// without them.
func clientTLS(certFile, keyFile string) (*tls.Config, error) {
	if (certFile == "") != (keyFile == "") {
		return nil, errors.New("--tls-cert and --tls-key go together")
	}
	if certFile == "" {
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("client certificate %s and key %s: %w", certFile, keyFile, err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

// client connects and opens a client; closeFn releases both.
func (c *connFlags) client(name string, cfg executor.ClientConfig) (cl *executor.Client, closeFn func(), err error) {
	nc, err := c.connect(name)
	if err != nil {
		return nil, nil, err
	}
	tel, stopTelemetry := clientTelemetry(name)
	if tel != nil {
		cfg.Observer = tel.Client()
	}
	cl, err = executor.NewClient(nc, cfg)
	if err != nil {
		nc.Close()
		stopTelemetry()
		return nil, nil, err
	}
	return cl, func() { _ = cl.Close(); nc.Close(); stopTelemetry() }, nil
}
