package broker

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// DefaultURL is where capstan looks for NATS when nothing else is said.
const DefaultURL = "nats://127.0.0.1:4222"

// ConnectOptions say how to reach NATS. Zero values are the defaults.
type ConnectOptions struct {
	// URL is one server URL or several separated by commas. Default
	// CAPSTAN_NATS_URL, else DefaultURL.
	URL string
	// Creds is a NATS credentials file (JWT and NKey seed).
	Creds string
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
