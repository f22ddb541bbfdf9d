package executor

import (
	"crypto/tls"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/capstan-dev/capstan/internal/broker"
)

// ConnectOptions say how to reach NATS. Zero values are the defaults.
type ConnectOptions struct {
	// URL is one server URL or several separated by commas. Default
	// CAPSTAN_NATS_URL, else nats://127.0.0.1:4222.
	URL string
	// Creds is a NATS credentials file (JWT and NKey seed). When it names a
	// capstan principal, replies come under the principal's inbox prefix, the
	// only one the server lets it receive on.
	Creds string
	// Prefix of capstan's names (default "CAPSTAN"), for the inbox prefix:
	// the deployment's Prefix.
	Prefix string
	// TLS is the client's TLS configuration when the server asks for more
	// than a known root: a client certificate (tls.LoadX509KeyPair), its own
	// roots or server name. Connect uses a copy.
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

// Connect opens the NATS connection a worker or a client takes: it
// reconnects on its own, forever, across every server it was given or learns
// of, and receives replies where a principal's credentials allow.
func Connect(o ConnectOptions) (*nats.Conn, error) {
	return broker.Connect(broker.ConnectOptions{URL: o.URL, Creds: o.Creds, Prefix: o.Prefix, TLS: o.TLS,
		TLSCA: o.TLSCA, Name: o.Name, Timeout: o.Timeout, Dialer: o.Dialer})
}

// Deployment is what the processes of one deployment share: the prefix of
// its names and how its streams and buckets are kept. A worker provisions
// them from it; a client only reads them. Zero values are the defaults.
type Deployment struct {
	// Prefix of every name (default "CAPSTAN"; subjects use it in lower case).
	Prefix string
	// Replicas of every stream and bucket. 0 is auto: a resource that exists
	// keeps the count it has, and a new one gets 3 on a JetStream cluster of
	// three or more servers, else 1. An explicit count must match existing
	// resources (`capstan admin replicas` changes it).
	Replicas int
	// ClusterSize, when known ahead, stands in for detection under auto: a
	// server knows the size of its cluster from its routes, and provisions R3
	// resources even while some of its peers are still starting.
	ClusterSize int
	// RecordTTL keeps execution records and approvals (default 7 days). It is
	// also how long a request may stay queued: a request never outlives the
	// record of its execution.
	RecordTTL time.Duration
	// AuditMaxAge is the audit stream's retention. Unset, a new stream keeps
	// events 30 days and an existing one keeps the retention it was given, so
	// that only the process that sets it needs to know it.
	AuditMaxAge time.Duration
	// AuditMaxBytes caps the audit stream (0: unlimited). With AuditDiscardNew a
	// full stream refuses new events instead of dropping old ones.
	AuditMaxBytes int64
	// AuditDiscardNew makes a full audit stream refuse new events.
	AuditDiscardNew bool
	// DedupWindow is the requests' duplicate window (default and minimum 2
	// min, at most RecordTTL).
	DedupWindow time.Duration
	// EnvelopeRetention is how long an envelope is kept. Unset, a new bucket
	// keeps envelopes 25 h and an existing one keeps what it was given; set,
	// an existing bucket with another retention is updated to it (logged).
	// Clients cap a request's start window below it (ClientConfig.StartWithin).
	EnvelopeRetention time.Duration
	// Logger receives what provisioning changes. Default slog.Default().
	Logger *slog.Logger
	// QueueMaxBytes bounds the bytes one principal's queue of requests may
	// hold (a queuedBytes quota, lower, bounds its own). 0: a new deployment
	// gets 1 GiB and an existing one keeps its own; -1: no bound. A full
	// queue refuses the request at its publication, never drops one stored.
	QueueMaxBytes int64
	// RecordWindow is how long an execution record outlives its last write
	// (default 15 min); a running execution's record stays. A deployment has
	// one window: the first worker records it, a worker set to another
	// refuses to start, and one that sets none adopts it.
	RecordWindow time.Duration
}

// config is the deployment as the broker takes it: the same fields.
func (d Deployment) config() broker.Config { return broker.Config(d) }
