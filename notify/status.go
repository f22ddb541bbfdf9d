package notify

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/broker"
)

// Stats is what one notifier delivered since it started. Counts are kept in
// memory: a restarted notifier starts from zero.
type Stats struct {
	ID       string         `json:"id"`
	Started  time.Time      `json:"started"`
	InFlight int            `json:"inFlight"`
	Channels []ChannelStats `json:"channels"`
	// Failures are the latest notifications given up, newest last.
	Failures []Failure `json:"failures,omitempty"`
}

// ChannelStats counts one channel's deliveries.
type ChannelStats struct {
	Name string `json:"name"`
	Kind Kind   `json:"kind"`
	// Where is the destination's host (never its URL, whose path may be a
	// secret) or mail server.
	Where string   `json:"where"`
	Types []string `json:"types"`
	// Sent notifications, Failed ones (given up: retries exhausted, or
	// refused for good), and Retries (failed attempts retried).
	Sent        uint64    `json:"sent"`
	Failed      uint64    `json:"failed"`
	Retries     uint64    `json:"retries"`
	LastSent    time.Time `json:"lastSent,omitzero"`
	LastFailure time.Time `json:"lastFailure,omitzero"`
}

// Failure is one notification given up.
type Failure struct {
	At       time.Time `json:"at"`
	Channel  string    `json:"channel"`
	Key      string    `json:"key"`
	Attempts int       `json:"attempts"`
	Error    string    `json:"error"`
}

// Stats returns the notifier's counts now.
func (n *Notifier) Stats() Stats {
	s := Stats{ID: n.cfg.ID, InFlight: int(n.inFlight.Load())}
	if t := n.started.Load(); t != 0 {
		s.Started = time.Unix(0, t).UTC()
	}
	for _, c := range n.chans {
		cs := ChannelStats{Name: c.Name, Kind: c.Kind, Where: c.Where(), Types: slices.Clone(c.Types),
			Sent: c.sent.Load(), Failed: c.failed.Load(), Retries: c.retries.Load()}
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

// RequestStatus asks every running notifier of the deployment for its
// Stats, and gathers the answers that arrive within wait.
func RequestStatus(ctx context.Context, nc *nats.Conn, n broker.Names, wait time.Duration) ([]Stats, error) {
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest(n.NotifyStatusSubject(), inbox, nil); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	var out []Stats
	for {
		m, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			break
		}
		var s Stats
		if json.Unmarshal(m.Data, &s) == nil {
			out = append(out, s)
		}
	}
	slices.SortFunc(out, func(a, b Stats) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// Queue is the notify consumer's state, as the server keeps it for every
// notifier.
type Queue struct {
	// Created is when notifications began: nothing decided or expired before
	// is notified.
	Created time.Time `json:"created"`
	// Waiting changes no notifier has taken yet; InFlight ones taken and not
	// done (an approval waiting for its expiry included); Redelivered ones
	// handed out again (a notifier stopped or gone).
	Waiting     uint64 `json:"waiting"`
	InFlight    int    `json:"inFlight"`
	Redelivered int    `json:"redelivered"`
}

// QueueOf reads the notify consumer's state.
func QueueOf(ctx context.Context, js jetstream.JetStream, n broker.Names) (Queue, error) {
	c, err := js.Consumer(ctx, "KV_"+n.ApprovalsBucket(), n.NotifyConsumer())
	if err != nil {
		return Queue{}, fmt.Errorf("capstan notify: consumer %s: %w", n.NotifyConsumer(), err)
	}
	i := c.CachedInfo()
	return Queue{Created: i.Created, Waiting: i.NumPending, InFlight: i.NumAckPending, Redelivered: i.NumRedelivered}, nil
}
