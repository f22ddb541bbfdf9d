package notifier

import (
	"encoding/json"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// Stats is what one notifier delivered since it started. Counts are kept in
// memory: a restarted notifier starts from zero.
type Stats struct {
	ID      string    `json:"id"`      // the notifier's id (Config.ID)
	Started time.Time `json:"started"` // when it started delivering; zero before
	// InFlight is how many approvals' notifications it is delivering, on
	// every channel (retries included).
	InFlight int            `json:"inFlight"`
	Channels []ChannelStats `json:"channels"` // one per configured channel, in the configuration's order
	// Failures are the latest notifications given up, newest last.
	Failures []Failure `json:"failures,omitempty"`
}

// ChannelStats counts one channel's deliveries.
type ChannelStats struct {
	Name string `json:"name"` // Channel.Name
	Kind Kind   `json:"kind"` // Channel.Kind
	// Where is the destination's host (never its URL, whose path may be a
	// secret) or mail server.
	Where string   `json:"where"`
	Types []string `json:"types"` // Channel.Types
	// Sent notifications, Failed ones (given up: retries exhausted, or
	// refused for good), and Retries (failed attempts retried).
	Sent        uint64    `json:"sent"`
	Failed      uint64    `json:"failed"`               // see Sent
	Retries     uint64    `json:"retries"`              // see Sent
	InFlight    int       `json:"inFlight"`             // approvals whose notification it is delivering now
	LastSent    time.Time `json:"lastSent,omitzero"`    // when it last delivered one; zero for never
	LastFailure time.Time `json:"lastFailure,omitzero"` // when it last gave one up; zero for never
}

// Failure is one notification given up.
type Failure struct {
	At       time.Time `json:"at"`       // when it was given up
	Channel  string    `json:"channel"`  // the channel's Name
	Key      string    `json:"key"`      // the notification's idempotency key (Key): "<approvalId>.<event>"
	Attempts int       `json:"attempts"` // attempts made, the last included
	Error    string    `json:"error"`    // the last attempt's error
}

// Stats returns the notifier's counts now.
func (n *Notifier) Stats() Stats {
	s := Stats{ID: n.cfg.ID}
	if t := n.started.Load(); t != 0 {
		s.Started = time.Unix(0, t).UTC()
	}
	for _, c := range n.chans {
		cs := ChannelStats{Name: c.Name, Kind: c.Kind, Where: c.Where(), Types: slices.Clone(c.Types),
			Sent: c.sent.Load(), Failed: c.failed.Load(), Retries: c.retries.Load(), InFlight: int(c.inFlight.Load())}
		s.InFlight += cs.InFlight
		if t := c.lastSent.Load(); t != 0 {
			cs.LastSent = time.Unix(0, t).UTC()
		}
		if t := c.lastFailed.Load(); t != 0 {
			cs.LastFailure = time.Unix(0, t).UTC()
		}
		s.Channels = append(s.Channels, cs)
	}
	n.mu.Lock()
	s.Failures = slices.Clone(n.failures)
	n.mu.Unlock()
	return s
}

// serveStatus answers every status request with the notifier's Stats. It
// answers only on an inbox: a request naming another subject as its reply
// would have the notifier write there.
func (n *Notifier) serveStatus() (*nats.Subscription, error) {
	return n.nc.Subscribe(n.names.NotifyStatusSubject(), func(m *nats.Msg) {
		if !strings.HasPrefix(m.Reply, "_INBOX") {
			return
		}
		if b, err := json.Marshal(n.Stats()); err == nil {
			_ = m.Respond(b)
		}
	})
}
