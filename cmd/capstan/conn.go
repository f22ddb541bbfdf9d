package main

import (
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"github.com/capstan-dev/capstan/broker"
	"github.com/capstan-dev/capstan/executor"
	"github.com/nats-io/nats.go"
)

// connFlags are the connection flags of every networked command.
type connFlags struct {
	url, creds, tlsCA, tlsCert, tlsKey string
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
	if err := probe(url); err != nil {
		return nil, err
	}
	nc, err := broker.Connect(o)
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

// probeWait bounds how long probe waits for a NATS server's greeting, which
// a server sends as soon as it accepts a connection.
const probeWait = 1500 * time.Millisecond

// probe looks, before connecting, at what listens at a single plain URL: a
// NATS server greets with INFO at once. Nothing listening, or a server that
// speaks another protocol (the console's HTTP port), is said at once rather
// than after the client's timeout. A cluster's several URLs, TLS and
// websockets are left to the client.
func probe(url string) error {
	if strings.Contains(url, ",") {
		return nil
	}
	addr := url
	if scheme, rest, ok := strings.Cut(url, "://"); ok {
		if strings.ToLower(scheme) != "nats" {
			return nil
		}
		addr = rest
	}
	if at := strings.LastIndex(addr, "@"); at >= 0 {
		addr = addr[at+1:]
	}
	addr = strings.TrimSuffix(addr, "/")
	if _, _, err := net.SplitHostPort(addr); err != nil {
		addr = net.JoinHostPort(addr, "4222")
	}
	conn, err := net.DialTimeout("tcp", addr, probeWait)
	if err != nil {
		return nil // the client says it, and explainConnect explains
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(probeWait))
	buf := make([]byte, 5)
	n, _ := io.ReadFull(conn, buf)
	if n >= 4 && string(buf[:4]) == "INFO" {
		return nil
	}
	what := "sends no NATS greeting"
	if n > 0 {
		what = fmt.Sprintf("greets with %q, not a NATS server's INFO", buf[:n])
	} else if speaksHTTP(addr) {
		what = "speaks HTTP, not NATS (is it the console's address? capstan's console serves 127.0.0.1:8233 by default, NATS 4222)"
	}
	return fmt.Errorf("capstan: %s %s: give the NATS server's address with --nats URL or CAPSTAN_NATS_URL (default %s)",
		broker.RedactURL(url), what, broker.DefaultURL)
}

// speaksHTTP reports whether the server at addr answers an HTTP request.
func speaksHTTP(addr string) bool {
	conn, err := net.DialTimeout("tcp", addr, probeWait)
	if err != nil {
		return false
	}
	defer conn.Close()
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

func (c *connFlags) options(name string) (broker.ConnectOptions, error) {
	tc, err := clientTLS(c.tlsCert, c.tlsKey)
	return broker.ConnectOptions{
		URL: c.url, Creds: c.creds, TLS: tc, TLSCA: c.tlsCA,
		Name: "capstan " + name, Timeout: 5 * time.Second,
	}, err
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
		cfg.Observer = tel
	}
	cl, err = executor.NewClient(nc, cfg)
	if err != nil {
		nc.Close()
		stopTelemetry()
		return nil, nil, err
	}
	return cl, func() { _ = cl.Close(); nc.Close(); stopTelemetry() }, nil
}
