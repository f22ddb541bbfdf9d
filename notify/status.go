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

// Queue is a notify consumer's state, as the server keeps it for every
// notifier of its channel.
type Queue struct {
	// Channel is the channel the consumer is for.
	Channel string `json:"channel"`
	// Created is when the channel's notifications began: nothing decided or
	// expired before is notified.
	Created time.Time `json:"created"`
	// Waiting changes no notifier has taken yet; InFlight ones taken and not
	// done (pending approvals waiting for their expiry included);
	// Redelivered ones handed out again (a notifier stopped or gone).
	Waiting     uint64 `json:"waiting"`
	InFlight    int    `json:"inFlight"`    // see Waiting
	Redelivered int    `json:"redelivered"` // see Waiting
	// Delivered counts every hand-out, redeliveries included.
	Delivered uint64 `json:"delivered"`
}

// Queues reads the state of every notify consumer of the deployment, by
// channel name.
func Queues(ctx context.Context, js jetstream.JetStream, n broker.Names) ([]Queue, error) {
	stream, err := js.Stream(ctx, "KV_"+n.ApprovalsBucket())
	if err != nil {
		return nil, fmt.Errorf("capstan: notify: stream KV_%s: %w", n.ApprovalsBucket(), err)
	}
	var out []Queue
	list := stream.ListConsumers(ctx)
	for i := range list.Info() {
		ch, ok := strings.CutPrefix(i.Name, broker.NotifyConsumerPrefix)
		if !ok || i.Config.DeliverSubject != "" {
			continue
		}
		out = append(out, queueOf(ch, i))
	}
	if err := list.Err(); err != nil {
		return nil, fmt.Errorf("capstan: notify: consumers of KV_%s: %w", n.ApprovalsBucket(), err)
	}
	slices.SortFunc(out, func(a, b Queue) int { return strings.Compare(a.Channel, b.Channel) })
	return out, nil
}

// channelQueue reads one channel's notify consumer.
func channelQueue(ctx context.Context, js jetstream.JetStream, n broker.Names, channel string) (Queue, error) {
	c, err := js.Consumer(ctx, "KV_"+n.ApprovalsBucket(), n.NotifyConsumer(channel))
	if err != nil {
		return Queue{}, fmt.Errorf("capstan: notify: consumer %s: %w", n.NotifyConsumer(channel), err)
	}
	return queueOf(channel, c.CachedInfo()), nil
}

func queueOf(channel string, i *jetstream.ConsumerInfo) Queue {
	return Queue{Channel: channel, Created: i.Created, Waiting: i.NumPending, InFlight: i.NumAckPending,
		Redelivered: i.NumRedelivered, Delivered: i.Delivered.Consumer}
}
