package await

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// How a client rides out a failover: a replicated stream that lost its leader
// answers again once its group elects another (seconds), and a connection
// whose server was lost reconnects to another server on its own.
const (
	// PublishTry bounds one attempt to store a request.
	PublishTry = 5 * time.Second
	// AsyncAckWait is how long an asynchronous publish waits for its
	// acknowledgement before it is published again.
	AsyncAckWait = broker.AsyncAckTimeout
	// sweepAfter: waiters older than this are re-read now and then even
	// when nothing suggests that a notification was missed.
	sweepAfter = 30 * time.Second
)

// Publish stores m in the exec stream. It publishes again under the same
// message id until JetStream acknowledges or refuses it, or ctx ends: within
// the dedup window a repeat of a request that was stored after all is
// dropped, so a lost acknowledgement never submits twice.
func Publish(ctx context.Context, nc *nats.Conn, m *nats.Msg, log *slog.Logger) (broker.Ack, error) {
	for try := 0; ; try++ {
		tctx, cancel := context.WithTimeout(ctx, PublishTry)
		ack, err := broker.PublishAck(tctx, nc, m)
		cancel()
		if err == nil || ctx.Err() != nil || !transient(err) {
			return ack, err
		}
		log.Debug("request not stored yet; publishing again", "subject", m.Subject, "try", try+1, "err", err)
		select {
		case <-ctx.Done():
			return ack, err
		case <-time.After(broker.Backoff(try)):
		}
	}
}

// transient reports whether a publish error may pass by itself: no stream
// answered (yet), or the answer was lost. A message the connection refused to
// send is final, and so is an error JetStream itself returned for the
// request, except "temporarily unavailable" (503) and "duplicate message id
// is in process": a replicated stream is still storing an earlier copy under
// this id, and publishing again ends with that copy's acknowledgement.
func transient(err error) bool {
	switch {
	case errors.Is(err, nats.ErrConnectionClosed), errors.Is(err, nats.ErrBadSubject),
		errors.Is(err, nats.ErrMaxPayload), errors.Is(err, nats.ErrInvalidMsg),
		errors.Is(err, nats.ErrHeadersNotSupported), errors.Is(err, nats.ErrInvalidContext):
		return false
	}
	if broker.AsQueueFull(err) != nil {
		// A full queue answers 503 too; it is the principal's own backlog,
		// which publishing again does not drain.
		return false
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return apiErr.Code == 503 || apiErr.ErrorCode == errDuplicateInProcess
	}
	return true
}

// errDuplicateInProcess is JetStream's "duplicate message id is in process".
const errDuplicateInProcess = 10158

// Envelope notifications are core NATS messages, so a client can miss one:
// while it reconnects, or when a stream leader is lost between storing an
// envelope and republishing it. The client notices both (a reconnect, a gap in
// the envelope stream's sequence) and re-reads the envelopes it waits for;
// every sweepAfter it also re-reads those waiting longer than that.
func (c *Waiters) watchMissed() {
	defer close(c.watchDone)
	t := time.NewTicker(time.Second)
	defer t.Stop()
	reconnects := c.b.NC.Stats().Reconnects
	lastSweep := time.Now()
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-c.gap:
			c.recheck(0)
		case now := <-t.C:
			next := make(chan struct{})
			close(*c.tick.Swap(&next))
			if r := c.b.NC.Stats().Reconnects; r != reconnects {
				reconnects = r
				c.recheck(0)
			} else if now.Sub(lastSweep) >= sweepAfter {
				lastSweep = now
				c.recheck(sweepAfter)
			}
		}
	}
}

// noteSequence signals a gap when a republished envelope does not follow the
// last one seen: the envelopes in between were stored but not seen here.
//
// A principal's subscription receives its own envelopes only, whose
// sequences have gaps by nature: it relies on reconnects and sweeps.
func (c *Waiters) noteSequence(m *nats.Msg) {
	if c.principal != broker.Anonymous {
		return
	}
	seq, err := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
	if err != nil {
		return
	}
	if prev := c.lastSeq.Swap(seq); prev != 0 && seq != prev+1 {
		select {
		case c.gap <- struct{}{}:
		default:
		}
	}
}

// recheck reads the envelope of every execution waited for since at least
// minAge and hands the ones that exist to their waiters.
func (c *Waiters) recheck(minAge time.Duration) {
	now := time.Now()
	c.mu.Lock()
	var ids []string
	for id, w := range c.waiters {
		if now.Sub(w.since) >= minAge {
			ids = append(ids, id)
		}
	}
	c.mu.Unlock()
	work := make(chan string)
	var wg sync.WaitGroup
	for range min(16, len(ids)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range work {
				ctx, cancel := context.WithTimeout(c.ctx, 5*time.Second)
				// From the leader: a replica catching up after a restart
				// answers "not found" for envelopes it has yet to receive.
				// A principal may read its own keys only, which the
				// leader's API cannot limit: it reads from any replica, and
				// the next recheck asks again.
				key := broker.Key(c.principal, id)
				var env *envelope.Envelope
				var err error
				if c.principal == broker.Anonymous {
					env, _, err = broker.LoadFromLeader[envelope.Envelope](ctx, c.b.NC, c.b.Envelopes, key)
				} else {
					env, _, err = broker.Load[envelope.Envelope](ctx, c.b.Envelopes, key)
				}
				cancel()
				if err == nil && envelope.CheckVersion(env.V) == nil {
					c.deliver(id, env)
				}
			}
		}()
	}
	for _, id := range ids {
		if c.ctx.Err() != nil {
			break
		}
		work <- id
	}
	close(work)
	wg.Wait()
}
