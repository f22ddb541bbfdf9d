package main

import (
	"flag"
	"time"

	"github.com/capstan-dev/capstan/auth"
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

func (c *connFlags) connect(name string) (*nats.Conn, error) {
	return broker.Connect(c.options(name))
}

func (c *connFlags) options(name string) broker.ConnectOptions {
	return broker.ConnectOptions{
		URL: c.url, Creds: c.creds, TLSCA: c.tlsCA, TLSCert: c.tlsCert, TLSKey: c.tlsKey,
		Name: "capstan " + name, Timeout: 5 * time.Second,
	}
}

// mayPublish refuses at once, naming the missing right, what the server
// would refuse silently: a publish the credentials' permissions do not allow.
// subject builds the subject from the credentials' principal.
func (c *connFlags) mayPublish(subject func(principal string) string) error {
	if c.creds == "" {
		return nil
	}
	p, err := broker.PrincipalFromCreds(c.creds)
	if err != nil {
		return nil // not a capstan principal: the server decides
	}
	return auth.CheckPublish(c.creds, subject(p))
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
