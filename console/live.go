package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/broker"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/nats-io/nats.go/jetstream"
)

// Live updates are server-sent events that only say "changed": the page then
// fetches its own part again (?part=...) and patches what differs, so the
// server renders every view in one place.

// Bursts of changes are coalesced into one event per period: a page that
// lists executions reads the audit window again on each, so it waits longer.
const (
	settleApprovals  = 250 * time.Millisecond
	settleExecutions = time.Second
)

// events streams "changed" to the browser each time something arrives on
// changed, at most once per settle, with a keep-alive comment while idle.
func events(w http.ResponseWriter, r *http.Request, settle time.Duration, changed <-chan struct{}, failed <-chan error) {
	fl, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	_, _ = fmt.Fprint(w, "retry: 2000\n: ready\n\n")
	fl.Flush()
	keep := time.NewTicker(15 * time.Second)
	defer keep.Stop()
	var due <-chan time.Time
	for {
		select {
		case <-r.Context().Done():
			return
		case err := <-failed:
			_, _ = fmt.Fprintf(w, "event: broken\ndata: %s\n\n", oneLine(err))
			fl.Flush()
			return
		case <-changed:
			if due == nil {
				due = time.After(settle)
			}
		case <-due:
			due = nil
			_, _ = fmt.Fprint(w, "event: changed\ndata: 1\n\n")
			fl.Flush()
		case <-keep.C:
			_, _ = fmt.Fprint(w, ": keep-alive\n\n")
			fl.Flush()
		}
	}
}

func oneLine(err error) string {
	if err == nil {
		return "closed"
	}
	b := []byte(err.Error())
	for i, c := range b {
		if c == '\n' || c == '\r' {
			b[i] = ' '
		}
	}
	return string(b)
}

func notify(ch chan<- struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// liveApprovals says when any approval changes: one key watcher per page.
func (c *Console) liveApprovals(w http.ResponseWriter, r *http.Request, s *session) {
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	watch, err := s.broker().Approvals.WatchAll(ctx, jetstream.UpdatesOnly())
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer func() { _ = watch.Stop() }()
	changed, failed := make(chan struct{}, 1), make(chan error, 1)
	go func() {
		for range watch.Updates() {
			notify(changed)
		}
		failed <- nil
	}()
	events(w, r, settleApprovals, changed, failed)
}

// liveExecutions says when any audit event arrives.
func (c *Console) liveExecutions(w http.ResponseWriter, r *http.Request, s *session) {
	c.follow(w, r, s.broker(), settleExecutions, audit.Filter{}, nil)
}

// liveExecution says when one execution's trail grows, from the sequence
// after the one its page showed, and again once its envelope exists: the
// final event is emitted just before the envelope is written.
func (c *Console) liveExecution(w http.ResponseWriter, r *http.Request, s *session) {
	id := r.PathValue("id")
	if envelope.ValidExecutionID(id) != nil {
		http.Error(w, "not an execution id", http.StatusNotFound)
		return
	}
	after, _ := strconv.ParseUint(r.URL.Query().Get("after"), 10, 64)
	b := s.broker()
	extra := func(ctx context.Context, ev audit.Event, changed chan<- struct{}) {
		switch ev.Type {
		case audit.Completed, audit.Failed, audit.Cancelled, audit.Denied, audit.ApprovalRequested:
		default:
			return
		}
		go func() {
			for i := 0; i < 50 && ctx.Err() == nil; i++ { // bounded: 10 s
				if _, _, err := broker.Load[envelope.Envelope](ctx, b.Envelopes, id); err == nil {
					notify(changed)
					return
				}
				select {
				case <-ctx.Done():
				case <-time.After(200 * time.Millisecond):
				}
			}
		}()
	}
	c.follow(w, r, b, settleApprovals, audit.Filter{ExecutionID: id}, extra, audit.FromSeq(after+1))
}

func (c *Console) follow(w http.ResponseWriter, r *http.Request, b *broker.Broker, settle time.Duration, f audit.Filter,
	extra func(context.Context, audit.Event, chan<- struct{}), opts ...audit.FollowOption) {
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	changed, failed := make(chan struct{}, 1), make(chan error, 1)
	go func() {
		err := audit.Follow(ctx, b, f, func(ev audit.Event) error {
			notify(changed)
			if extra != nil {
				extra(ctx, ev, changed)
			}
			return nil
		}, opts...)
		if err != nil && !errors.Is(err, context.Canceled) {
			c.log.Warn("console: following the audit stream", "err", err)
		}
		failed <- err
	}()
	events(w, r, settle, changed, failed)
}
