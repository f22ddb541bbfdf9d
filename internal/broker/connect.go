package broker

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// DefaultURL is where capstan looks for NATS when nothing else is said.
const DefaultURL = "nats://127.0.0.1:4222"

// ConnectOptions say how to reach NATS. Zero values are the defaults.
type ConnectOptions struct {
	// URL is one server URL or several separated by commas. Default
	// CAPSTAN_NATS_URL, else DefaultURL.
	URL string
	// Creds is a NATS credentials file (JWT and NKey seed). When it names a
	// capstan principal, replies come under the principal's inbox prefix, the
	// only one the server lets it receive on.
	Creds string
	// Credentials, when it was read from Creds (ReadCredentials), is used
	// instead of reading the file again; credentials of another file are
	// ignored.
	Credentials *Credentials
	// Prefix of capstan's names (default "CAPSTAN"), for the inbox prefix.
	Prefix string
	// TLS is the client's TLS configuration when the server asks for more
	// than a known root: a client certificate (tls.LoadX509KeyPair), its own
	// roots or server name. Connect uses a copy. capstan parses no key files
	// itself, so a program that never sets it links no private-key parsing.
	TLS *tls.Config
	// TLSCA is a PEM file of the root certificates that signed the server's
	// certificate; when set, they are the roots, in place of TLS.RootCAs.
	TLSCA string
	// Name is the connection name shown by the server's monitoring.
	Name string
	// Timeout bounds the first connection attempt. Default 5 s.
	Timeout time.Duration
	// Dialer, when set, dials the server's TCP connections instead of the
	// client's own dialer.
	Dialer nats.CustomDialer
}

// ResolveURL returns the URL the options connect to.
func (o ConnectOptions) ResolveURL() string {
	if o.URL != "" {
		return o.URL
	}
	if u := os.Getenv("CAPSTAN_NATS_URL"); u != "" {
		return u
	}
	return DefaultURL
}

// RedactURL returns a server URL, or several separated by commas, without the
// user, password or token any of them carries: what may be printed.
func RedactURL(urls string) string {
	parts := strings.Split(urls, ",")
	for i, u := range parts {
		rest := u
		scheme, after, hasScheme := strings.Cut(u, "://")
		if hasScheme {
			rest = after
		}
		at := strings.LastIndex(rest, "@")
		if at < 0 {
			continue
		}
		rest = rest[at+1:]
		if hasScheme {
			rest = scheme + "://" + rest
		}
		parts[i] = rest
	}
	return strings.Join(parts, ",")
}

// Connect opens a NATS connection that reconnects on its own, forever, across
// every server it was given or learns of.
func Connect(o ConnectOptions) (*nats.Conn, error) {
	opts := []nats.Option{
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.ReconnectBufSize(64 << 20),
	}
	if o.Name != "" {
		opts = append(opts, nats.Name(o.Name))
	}
	if o.Timeout > 0 {
		opts = append(opts, nats.Timeout(o.Timeout))
	}
	if o.Dialer != nil {
		opts = append(opts, nats.SetCustomDialer(o.Dialer))
	}
	if o.Creds != "" {
		c := o.Credentials
		if c == nil || c.Path != o.Creds {
			var err error
			if c, err = ReadCredentials(o.Creds); err != nil {
				return nil, err
			}
		}
		opt, connected := c.option()
		defer connected()
		opts = append(opts, opt)
		if c.Principal != "" {
			opts = append(opts, nats.CustomInboxPrefix(NewNames(o.Prefix).InboxPrefix(c.Principal)))
		}
	}
	if o.TLS != nil {
		opts = append(opts, nats.Secure(o.TLS.Clone()))
	}
	if o.TLSCA != "" {
		opts = append(opts, nats.RootCAs(o.TLSCA))
	}
	url := o.ResolveURL()
	nc, err := nats.Connect(strings.ReplaceAll(url, " ", ""), opts...)
	if err != nil {
		return nil, fmt.Errorf("capstan: connect to %s: %w", RedactURL(url), err)
	}
	return nc, nil
}

// ConnectWait connects as Connect does, and while no server answers (none is
// up yet, the cluster is still forming) tries again with a log line until one
// does, ctx ends, or wait has passed (0: no bound). A process started before
// its servers (a compose file, a rollout) waits for them instead of exiting.
// A refusal (credentials, TLS) is returned at once.
func ConnectWait(ctx context.Context, o ConnectOptions, wait time.Duration, log *slog.Logger) (*nats.Conn, error) {
	start := time.Now()
	for try := 0; ; try++ {
		nc, err := Connect(o)
		if err == nil {
			if try > 0 {
				log.Info("connected to NATS", "url", RedactURL(o.ResolveURL()))
			}
			return nc, nil
		}
		if !Unreachable(err) {
			return nil, err
		}
		if wait > 0 && time.Since(start) >= wait {
			return nil, fmt.Errorf("%w (waited %v)", err, wait.Round(time.Second))
		}
		log.Warn("waiting for NATS: no server answers yet; retrying", "url", RedactURL(o.ResolveURL()), "err", err)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(min(250*time.Millisecond<<min(try, 3), 2*time.Second)):
		}
	}
}

// Unreachable reports whether err says that no server answered, or that the
// cluster is not ready yet (no JetStream leader, no peers to place a
// replica on), rather than that a server refused: waiting may help.
func Unreachable(err error) bool {
	var ne net.Error
	var api *jetstream.APIError
	var pe *fs.PathError
	if errors.As(err, &pe) {
		// A file of the options (credentials, a root certificate) that is
		// missing or unreadable: no server was asked, and waiting will not
		// write it. (A PathError passes for a net.Error.)
		return false
	}
	if errors.As(err, &api) && (api.Code == 503 || api.ErrorCode == jsClusterNoPeers) {
		return true
	}
	return errors.Is(err, nats.ErrNoServers) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, jetstream.ErrJetStreamNotEnabled) ||
		errors.As(err, &ne)
}

// jsClusterNoPeers: "no suitable peers for placement", a cluster still forming.
const jsClusterNoPeers = 10005

// PrincipalOf returns the principal a connection acts as: the one whose inbox
// prefix it uses (see Connect), else Anonymous. The server, not this answer,
// enforces it: a connection that claims another principal's prefix receives
// no replies.
func PrincipalOf(nc *nats.Conn, n Names) string {
	if p, ok := strings.CutPrefix(nc.Opts.InboxPrefix, "_INBOX_"+n.subject+"."); ok && ValidPrincipal(p) {
		return p
	}
	return Anonymous
}
