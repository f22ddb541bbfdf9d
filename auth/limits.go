package auth

import (
	"errors"
	"fmt"

	"github.com/nats-io/jwt/v2"
)

// Limits bound what one principal's account may hold on the server, so that
// a principal exhausts only its own share: the server refuses a connection,
// a subscription or a message beyond them, to that principal alone. -1 is no
// limit.
type Limits struct {
	// Connections at once, across every server of a cluster.
	Connections int64 `json:"connections"`
	// Subscriptions at once, of all its connections together.
	Subscriptions int64 `json:"subscriptions"`
	// Payload is the largest message it may publish, in bytes: a request's
	// input and everything else it sends.
	Payload int64 `json:"payload"`
}

// DefaultLimits are a principal's limits unless auth add says otherwise:
// ample for an agent host, an MCP bridge or a console session (each holds a
// connection and a handful of subscriptions), far below what would let one
// principal crowd the server.
var DefaultLimits = Limits{Connections: 64, Subscriptions: 1024, Payload: 256 << 10}

// OrDefault returns l, or DefaultLimits for a nil l.
func (l *Limits) OrDefault() Limits {
	if l == nil {
		return DefaultLimits
	}
	return *l
}

// validate refuses limits no server can keep: each positive or -1 (none).
func (l Limits) validate() error {
	errs := positiveOrNone("limit", []named{{"connections", l.Connections}, {"subscriptions", l.Subscriptions}, {"payload", l.Payload}})
	if l.Payload > 64<<20 {
		errs = append(errs, fmt.Errorf("limit payload %d: at most 64 MiB", l.Payload))
	}
	return errors.Join(errs...)
}

// apply writes l into an account's claims.
func (l *Limits) apply(ac *jwt.AccountClaims) {
	ac.Limits.Conn = l.Connections
	ac.Limits.Subs = l.Subscriptions
	ac.Limits.Payload = l.Payload
	ac.Limits.LeafNodeConn = 0 // a principal never connects a leaf node
	ac.Limits.Data = jwt.NoLimit
	ac.Limits.Imports = jwt.NoLimit
	ac.Limits.Exports = 0
	ac.Limits.WildcardExports = false
}
