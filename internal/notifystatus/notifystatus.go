// Package notifystatus reads how a deployment's notifiers fare, for capstan
// notify --status: each running notifier's counts (Request) and the state
// the server keeps of each channel's notify consumer (Queues).
package notifystatus

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/notifier"
)

// Request asks every running notifier of the deployment for its
// notifier.Stats, and gathers the answers that arrive within wait.
func Request(ctx context.Context, nc *nats.Conn, n broker.Names, wait time.Duration) ([]notifier.Stats, error) {
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
	var out []notifier.Stats
	for {
		m, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			break
		}
		var s notifier.Stats
		if json.Unmarshal(m.Data, &s) == nil {
			out = append(out, s)
		}
	}
	slices.SortFunc(out, func(a, b notifier.Stats) int { return strings.Compare(a.ID, b.ID) })
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

func queueOf(channel string, i *jetstream.ConsumerInfo) Queue {
	return Queue{Channel: channel, Created: i.Created, Waiting: i.NumPending, InFlight: i.NumAckPending,
		Redelivered: i.NumRedelivered, Delivered: i.Delivered.Consumer}
}
