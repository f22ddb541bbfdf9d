package notifier

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/broker"
)

// Settings of the notify consumers.
const (
	// consumerAckWait is how long a change may go without word from the notifier
	// that took it (a notifier working on one says so every third of the
	// consumer's AckWait) before the server hands it to another: how long a
	// killed notifier's notifications wait.
	consumerAckWait = 30 * time.Second
	// defaultConcurrency is how many approvals one notifier works on at once
	// for one channel.
	defaultConcurrency = 64
	// fetchWait is how long one pull waits for an approval to change.
	fetchWait = 5 * time.Second
	// recentFailures is how many failures Stats keeps.
	recentFailures = 20
)

// ErrNoConsumer: a channel's notify consumer does not exist, and this
// notifier may not (or was not told to) create it.
var ErrNoConsumer = errors.New("capstan: notify: no notify consumer")

// ErrNotProvisioned: the approvals bucket does not exist yet (no server or
// worker provisioned capstan's resources).
var ErrNotProvisioned = errors.New("capstan: notify: no approvals bucket yet")

// Notifier delivers the notifications of a deployment's approvals to its
// channels. Each channel has a durable consumer that several notifiers (in
// workers, in capstan notify processes) share: each change of an approval
// goes, for each channel, to one of them.
type Notifier struct {
	nc    *nats.Conn
	js    jetstream.JetStream
	names broker.Names
	cfg   Config
	log   *slog.Logger
	chans []*channel
	now   func() time.Time

	started atomic.Int64 // unix nanoseconds, once Run reads the consumers
	// scrub hides every channel's secrets in a text (an error a library
	// composed, a server's answer).
	scrub *strings.Replacer

	mu       sync.Mutex
	failures []Failure // newest last
}

// channel is a configured channel, its sender and its counts.
type channel struct {
	Channel
	s                     sender
	sent, failed, retries atomic.Uint64
	lastSent, lastFailed  atomic.Int64 // unix nanoseconds
	inFlight              atomic.Int64
	// handled counts the changes this notifier finished with (acked,
	// handed back or terminated).
	handled atomic.Uint64
}

// New returns a notifier of cfg's channels on nc. Nothing is read until Run.
func New(nc *nats.Conn, cfg Config) (*Notifier, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	cfg.Retry = cfg.Retry.withDefaults()
	if cfg.Timeout <= 0 {
		cfg.Timeout = defaultTimeout
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = defaultConcurrency
	}
	if cfg.ID == "" {
		host, _ := os.Hostname()
		cfg.ID = fmt.Sprintf("notify-%s-%d", host, os.Getpid())
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	n := &Notifier{nc: nc, js: js, names: broker.NewNames(cfg.Prefix), cfg: cfg,
		log: cfg.Logger.With("notifier", cfg.ID), now: func() time.Time { return time.Now().UTC() }}
	var secrets []string
	for _, c := range cfg.Channels {
		ch := &channel{Channel: c}
		switch c.Kind {
		case KindEmail:
			ch.s = newEmailSender(c, n.now)
		default:
			ch.s = newHTTPSender(c, n.now)
		}
		n.chans = append(n.chans, ch)
		secrets = append(secrets, secretForms(c)...)
	}
	var pairs []string
	for _, s := range secrets {
		if len(s) >= 4 {
			pairs = append(pairs, s, redacted)
		}
	}
	n.scrub = strings.NewReplacer(pairs...)
	return n, nil
}

// secretForms are the texts of a channel that must never be printed: its
// secrets, its URL and the URL's path and query, as they are and escaped.
func secretForms(c Channel) []string {
	var out []string
	for _, s := range []string{c.URL.reveal(), c.Secret.reveal(), c.SMTP.Password.reveal()} {
		if s != "" {
			out = append(out, s)
		}
	}
	if u, err := url.Parse(c.URL.reveal()); err == nil {
		for _, s := range []string{u.EscapedPath(), u.Path, u.RawQuery} {
			if len(s) > 1 {
				out = append(out, s)
			}
		}
	}
	return out
}

// consumerConfig is a channel's notify consumer: durable, pulled, every
// change of every approval from the current state of each when it is
// created.
func consumerConfig(n broker.Names, channel string) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       n.NotifyConsumer(channel),
		Description:   "capstan notifications of approvals to channel " + channel + " (capstan notify)",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       consumerAckWait,
		MaxDeliver:    -1,
		MaxAckPending: -1, // a pending approval waits for its expiry in flight: never a cap
		DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy,
		FilterSubject: "$KV." + n.ApprovalsBucket() + ".>",
	}
}

// Provision creates the notify consumer of each of cfg's channels on the
// approvals bucket's stream, or checks the existing ones; it needs the right
// to create consumers (an admin's or a worker's credentials). It is
// idempotent.
func Provision(ctx context.Context, js jetstream.JetStream, cfg Config) error {
	n := broker.NewNames(cfg.Prefix)
	for _, ch := range cfg.Channels {
		if _, err := provision(ctx, js, n, ch.Name); err != nil {
			return err
		}
	}
	return nil
}

func provision(ctx context.Context, js jetstream.JetStream, n broker.Names, channel string) (jetstream.Consumer, error) {
	if !validName(channel) {
		return nil, fmt.Errorf("%w: channel name %q: want [a-z0-9_-], 1 to 64 bytes", ErrConfig, channel)
	}
	stream, name := "KV_"+n.ApprovalsBucket(), n.NotifyConsumer(channel)
	c, err := js.Consumer(ctx, stream, name)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		c, err = js.CreateConsumer(ctx, stream, consumerConfig(n, channel))
	}
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("%w (%s): capstan server or a worker provisions it", ErrNotProvisioned, n.ApprovalsBucket())
	}
	if err != nil {
		return nil, fmt.Errorf("capstan: notify: consumer %s on %s: %w", name, stream, err)
	}
	return c, checkConsumer(c.CachedInfo(), n)
}

func checkConsumer(info *jetstream.ConsumerInfo, n broker.Names) error {
	c := info.Config
	if c.AckPolicy != jetstream.AckExplicitPolicy || c.DeliverSubject != "" || c.FilterSubject != "$KV."+n.ApprovalsBucket()+".>" {
		return fmt.Errorf("%w: consumer %s on %s is not a notify consumer (explicit acks, pulled, filtered on %s): remove it or choose another prefix",
			broker.ErrConfigConflict, info.Name, info.Stream, "$KV."+n.ApprovalsBucket()+".>")
	}
	return nil
}

// bind finds a channel's consumer, creating it when the configuration says so.
func (n *Notifier) bind(ctx context.Context, channel string) (jetstream.Consumer, error) {
	if n.cfg.Provision {
		return provision(ctx, n.js, n.names, channel)
	}
	c, err := n.js.Consumer(ctx, "KV_"+n.names.ApprovalsBucket(), n.names.NotifyConsumer(channel))
	switch {
	case errors.Is(err, jetstream.ErrConsumerNotFound), errors.Is(err, jetstream.ErrStreamNotFound):
		return nil, fmt.Errorf("%w: channel %s has no consumer %s on KV_%s: create the channels' consumers with an admin's credentials (capstan notify --init --config FILE --creds DIR/admin.creds), or run the notifier in a worker (capstan worker --notify FILE)",
			ErrNoConsumer, channel, n.names.NotifyConsumer(channel), n.names.ApprovalsBucket())
	case err != nil:
		return nil, fmt.Errorf("capstan: notify: consumer %s: %w", n.names.NotifyConsumer(channel), err)
	}
	return c, checkConsumer(c.CachedInfo(), n.names)
}

// Run delivers notifications until ctx ends, then finishes the deliveries in
// flight (a delivery waiting to be retried is handed back to the server at
// once, for any notifier). Each channel reads its own consumer, so a channel
// whose receiver is down delays no other. Run returns an error only when it
// cannot start: no consumer, no right to read one.
func (n *Notifier) Run(ctx context.Context) error {
	var conss []jetstream.Consumer
	for _, c := range n.chans {
		cons, err := n.bind(ctx, c.Name)
		if err != nil {
			return err
		}
		conss = append(conss, cons)
	}
	n.started.Store(n.now().UnixNano())
	if !n.cfg.NoStatus {
		sub, err := n.serveStatus()
		if err != nil {
			return fmt.Errorf("capstan: notify: status: %w", err)
		}
		defer func() { _ = sub.Unsubscribe() }()
	}
	defer n.closeIdle()
	var wg sync.WaitGroup
	for i, c := range n.chans {
		info := conss[i].CachedInfo()
		n.log.Info("notifier started", "channel", c.Name, "kind", c.Kind, "consumer", info.Name,
			"since", info.Created.UTC().Format(time.RFC3339))
		wg.Add(1)
		go func() {
			defer wg.Done()
			n.pull(ctx, c, conss[i])
		}()
	}
	wg.Wait()
	return nil
}

// pull works on a channel's consumer until ctx ends, at most Concurrency
// approvals at once.
func (n *Notifier) pull(ctx context.Context, c *channel, cons jetstream.Consumer) {
	info := cons.CachedInfo()
	since, ackWait := info.Created, info.Config.AckWait
	slots := make(chan struct{}, n.cfg.Concurrency)
	var wg sync.WaitGroup
	defer wg.Wait()
	quietUntil := time.Time{}
	for {
		select {
		case <-ctx.Done():
			return
		case slots <- struct{}{}:
		}
		m, err := fetchOne(ctx, cons)
		if m == nil {
			<-slots
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				if time.Now().After(quietUntil) {
					n.log.Warn("reading approvals failed; retrying", "channel", c.Name, "err", err)
					quietUntil = time.Now().Add(time.Minute)
				}
				select {
				case <-ctx.Done():
					return
				case <-time.After(time.Second):
				}
			}
			continue
		}
		wg.Add(1)
		c.inFlight.Add(1)
		go func() {
			defer func() { c.handled.Add(1); c.inFlight.Add(-1); <-slots; wg.Done() }()
			n.handle(ctx, c, m, since, ackWait)
		}()
	}
}

// fetchOne pulls one message, waiting up to fetchWait; nil and no error when
// none came.
func fetchOne(ctx context.Context, cons jetstream.Consumer) (jetstream.Msg, error) {
	fctx, cancel := context.WithTimeout(ctx, fetchWait)
	defer cancel()
	batch, err := cons.Fetch(1, jetstream.FetchContext(fctx))
	if err != nil {
		return nil, err
	}
	for m := range batch.Messages() {
		return m, nil
	}
	if err := batch.Error(); err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) &&
		!errors.Is(err, nats.ErrTimeout) {
		return nil, err
	}
	return nil, nil
}

// handle works on one revision of one approval for channel c: it decides
// what is due (due), delivers it when the approval is of the channel's
// types, and acks, or hands the revision back to come again at the
// approval's expiry.
func (n *Notifier) handle(ctx context.Context, c *channel, m jetstream.Msg, since time.Time, ackWait time.Duration) {
	if op := m.Headers().Get("KV-Operation"); op != "" {
		n.ack(m) // a delete or a purge: nothing to say
		return
	}
	var rec approvals.Record
	if err := envelope.Unmarshal(m.Data(), &rec); err != nil || rec.ID == "" {
		n.log.Warn("not an approval record: skipped", "channel", c.Name, "subject", m.Subject(), "err", err)
		_ = m.Term()
		return
	}
	if !c.receives(rec.Types) {
		n.ack(m)
		return
	}
	p := due(&rec, since, n.now())
	if p.event == "" {
		n.ack(m)
		return
	}
	note := newNotification(&rec, p, n.cfg.ConsoleURL)
	stop := keepAlive(m, ackWait)
	done := n.deliver(ctx, c, note)
	stop()
	if !done {
		// Stopping: another notifier sends it, once this one's last pull
		// has expired. Handed back at once, the server could give it to
		// that pull, which nobody reads any more, and nobody would send it
		// before the consumer's AckWait.
		_ = m.NakWithDelay(fetchWait)
		return
	}
	if !p.again.IsZero() {
		if d := p.again.Sub(n.now()); d > 0 {
			_ = m.NakWithDelay(d)
			return
		}
	}
	n.ack(m)
}

// closeIdle closes the HTTP connections kept for the next delivery.
func (n *Notifier) closeIdle() {
	for _, c := range n.chans {
		if h, ok := c.s.(*httpSender); ok {
			h.client.CloseIdleConnections()
		}
	}
}

func (n *Notifier) ack(m jetstream.Msg) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := m.DoubleAck(ctx); err != nil {
		n.log.Warn("acknowledgement not confirmed: the notification may be sent again", "subject", m.Subject(), "err", err)
	}
}

// keepAlive tells the server every third of the consumer's ackWait that the
// message is being worked on, until stop.
func keepAlive(m jetstream.Msg, ackWait time.Duration) (stop func()) {
	if ackWait <= 0 {
		ackWait = consumerAckWait
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(ackWait / 3)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				_ = m.InProgress()
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}

// deliver sends note to c, retrying with backoff up to the configured
// attempts. It reports false when ctx ended before it was done (sent, or
// given up).
func (n *Notifier) deliver(ctx context.Context, c *channel, note *notification) bool {
	r := n.cfg.Retry
	for attempt := 1; ; attempt++ {
		// An attempt under way finishes even when ctx ends: cut short, the
		// receiver could have it without the notifier knowing.
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), n.cfg.Timeout)
		err := c.s.send(actx, note)
		cancel()
		if err == nil {
			c.sent.Add(1)
			c.lastSent.Store(n.now().UnixNano())
			return true
		}
		msg := n.scrub.Replace(err.Error())
		if isPermanent(err) || attempt >= r.Attempts {
			c.failed.Add(1)
			c.lastFailed.Store(n.now().UnixNano())
			n.recordFailure(Failure{At: n.now(), Channel: c.Name, Key: note.key, Attempts: attempt, Error: msg})
			n.log.Error("notification not delivered: given up", "channel", c.Name, "kind", c.Kind, "key", note.key,
				"attempts", attempt, "permanent", isPermanent(err), "err", msg)
			return true
		}
		c.retries.Add(1)
		wait := r.backoff(attempt)
		if ra := retryAfterOf(err); ra > wait {
			wait = min(ra, r.Max)
		}
		n.log.Warn("notification not delivered yet; retrying", "channel", c.Name, "kind", c.Kind, "key", note.key,
			"attempt", attempt, "retryIn", wait.String(), "err", msg)
		select {
		case <-ctx.Done():
			return false
		case <-time.After(wait):
		}
	}
}

func (n *Notifier) recordFailure(f Failure) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.failures = append(n.failures, f)
	if len(n.failures) > recentFailures {
		n.failures = n.failures[len(n.failures)-recentFailures:]
	}
}
