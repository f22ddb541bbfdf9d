package broker

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
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
	// Prefix of capstan's names (default "CAPSTAN"), for the inbox prefix.
	Prefix string
	// TLSCA, TLSCert and TLSKey enable TLS with a custom root and a client
	// certificate.
	TLSCA, TLSCert, TLSKey string
	// Name is the connection name shown by the server's monitoring.
	Name string
	// Timeout bounds the first connection attempt. Default 5 s.
	Timeout time.Duration
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
	if o.Creds != "" {
		if _, err := os.Stat(o.Creds); err != nil {
			return nil, fmt.Errorf("capstan: credentials file: %w", err)
		}
		opts = append(opts, nats.UserCredentials(o.Creds))
		if p, err := PrincipalFromCreds(o.Creds); err == nil {
			opts = append(opts, nats.CustomInboxPrefix(NewNames(o.Prefix).InboxPrefix(p)))
		}
	}
	if o.TLSCA != "" {
		opts = append(opts, nats.RootCAs(o.TLSCA))
	}
	if (o.TLSCert == "") != (o.TLSKey == "") {
		return nil, errors.New("capstan: --tls-cert and --tls-key go together")
	}
	if o.TLSCert != "" {
		opts = append(opts, nats.ClientCert(o.TLSCert, o.TLSKey))
	}
	url := o.ResolveURL()
	nc, err := nats.Connect(strings.ReplaceAll(url, " ", ""), opts...)
	if err != nil {
		return nil, fmt.Errorf("capstan: connect to %s: %w", url, err)
	}
	return nc, nil
}

// PrincipalFromCreds returns the capstan principal a credentials file names
// (its user's name).
func PrincipalFromCreds(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("capstan: credentials file: %w", err)
	}
	tok, err := jwt.ParseDecoratedJWT(b)
	if err != nil {
		return "", fmt.Errorf("capstan: credentials file %s: %w", path, err)
	}
	uc, err := jwt.DecodeUserClaims(tok)
	if err != nil {
		return "", fmt.Errorf("capstan: credentials file %s: %w", path, err)
	}
	if !ValidPrincipal(uc.Name) || uc.Name == Anonymous {
		return "", fmt.Errorf("capstan: credentials file %s names no capstan principal (%q)", path, uc.Name)
	}
	return uc.Name, nil
}

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
