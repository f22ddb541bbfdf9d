package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
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
// changed, at most once per settle, and each progress report that arrives
// on progress (nil: none), at most one per settleProgress, with a
// keep-alive comment while idle, until the request or the session (ended)
// ends.
func events(w http.ResponseWriter, r *http.Request, ended <-chan struct{}, settle time.Duration, changed <-chan struct{}, failed <-chan error, progress <-chan []byte) {
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
	var ps progressSender
	for {
		select {
		case <-r.Context().Done():
			return
		case <-ended:
			// Signed out or expired: the page's next request asks for
			// sign-in.
			_, _ = fmt.Fprint(w, "event: broken\ndata: signed out\n\n")
			fl.Flush()
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
		case b := <-progress:
			ps.offer(b)
		case <-ps.due:
			ps.send(w, fl)
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

// listen subscribes to a feed until the request ends: keep decides which
// changes matter; a failed source ends the stream (the browser reconnects).
func listen(f *feed, changed chan<- struct{}, failed chan<- error, keep func(any) bool) (func(), error) {
	return f.subscribe(func(v any) {
		if err, ok := v.(error); ok {
			select {
			case failed <- err:
			default:
			}
			return
		}
		if keep == nil || keep(v) {
			notify(changed)
		}
	})
}

// liveApprovals says when any approval changes.
func (c *Console) liveApprovals(w http.ResponseWriter, r *http.Request, s *session) {
	changed, failed := make(chan struct{}, 1), make(chan error, 1)
	unsub, err := listen(s.feeds.approvals, changed, failed, nil)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer unsub()
	// A change between the page's render and now would be missed: look again.
	notify(changed)
	events(w, r, s.done, settleApprovals, changed, failed, nil)
}

// pollEvery is how often a live page of a session that may not follow the
// trail (a producer, an approver) reads what it shows again.
const pollExecutions = 2 * time.Second

// poll calls fingerprint every period until ctx ends and notifies changed
// whenever it differs from want (what the page showed).
func poll(ctx context.Context, want string, fingerprint func(context.Context) (string, error), changed chan<- struct{}) {
	t := time.NewTicker(pollExecutions)
	defer t.Stop()
	for {
		fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		got, err := fingerprint(fctx)
		cancel()
		if err == nil && got != want {
			want = got
			notify(changed)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// liveExecutions says when the list may have changed: any audit event after
// the one the page showed, for a session that follows the trail; otherwise
// a first page that differs from the one the page showed.
func (c *Console) liveExecutions(w http.ResponseWriter, r *http.Request, s *session) {
	changed, failed := make(chan struct{}, 1), make(chan error, 1)
	if s.broker() == nil {
		if s.reads == nil {
			http.Error(w, errNotPermitted.Error(), http.StatusForbidden)
			return
		}
		ctx, cancel := context.WithCancel(r.Context())
		defer cancel()
		f := parseExecFilter(r.URL.Query(), time.Now())
		f.Cursor = ""
		go poll(ctx, r.URL.Query().Get("v"), func(ctx context.Context) (string, error) {
			d, err := readList(ctx, s, f)
			if err != nil {
				return "", err
			}
			return d.Fingerprint(), nil
		}, changed)
		events(w, r, s.done, settleExecutions, changed, failed, nil)
		return
	}
	unsub, err := listen(s.feeds.audit, changed, failed, nil)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer unsub()
	// What was stored between the page's render and the subscription.
	after, _ := strconv.ParseUint(r.URL.Query().Get("after"), 10, 64)
	if info, err := s.broker().Audit.Info(r.Context()); err == nil && info.State.LastSeq > after {
		notify(changed)
	}
	events(w, r, s.done, settleExecutions, changed, failed, nil)
}

// liveExecution says when one execution changes: for a session that follows
// the trail, when its trail grows past the sequence its page showed, and
// again once its envelope exists (the final event is emitted just before the
// envelope is written); otherwise when what the workers show of it differs
// from what the page showed.
func (c *Console) liveExecution(w http.ResponseWriter, r *http.Request, s *session) {
	id := r.PathValue("id")
	if envelope.ValidExecutionID(id) != nil {
		http.Error(w, "not an execution id", http.StatusNotFound)
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	changed, failed := make(chan struct{}, 1), make(chan error, 1)
	b, owner := s.broker(), s.owner(r)
	// Its progress, live, for a session that may receive it.
	var progress chan []byte
	followed := func(owner string) {
		if !s.mayFollowProgress(owner) {
			return
		}
		if owner == "" {
			owner = s.p.Name
		}
		ch := make(chan []byte, 1)
		unsub, err := followProgress(s.nc, s.names, owner, id, ch)
		if err != nil {
			return // best effort: the page still shows the record's
		}
		progress = ch
		context.AfterFunc(ctx, unsub)
	}
	if b == nil {
		if s.reads == nil {
			http.Error(w, errNotPermitted.Error(), http.StatusForbidden)
			return
		}
		go poll(ctx, r.URL.Query().Get("v"), func(ctx context.Context) (string, error) {
			d, err := loadExecution(ctx, s, id, owner)
			if errors.Is(err, executor.ErrNoSuchExecution) {
				return "unknown", nil
			}
			if err != nil {
				return "", err
			}
			return d.Fingerprint, nil
		}, changed)
		followed(owner)
		events(w, r, s.done, settleApprovals, changed, failed, progress)
		return
	}
	if owner == "" {
		// An admin's page that named no owner: the one principal with an
		// execution of this id (ids are unique per principal).
		owner = s.p.Name
		if owners, err := broker.Owners(ctx, b, id); err == nil && len(owners) == 1 {
			owner = owners[0]
		}
	}
	awaitEnvelope := func() {
		for i := 0; i < 50 && ctx.Err() == nil; i++ { // bounded: 10 s
			if _, err := b.Envelopes.Get(ctx, broker.Key(owner, id)); err == nil {
				notify(changed)
				return
			}
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	unsub, err := listen(s.feeds.audit, changed, failed, func(v any) bool {
		ev, ok := v.(audit.Event)
		if !ok || ev.ExecutionID != id || ev.Key() != broker.Key(owner, id) {
			return false
		}
		switch ev.Type {
		case audit.EventCompleted, audit.EventFailed, audit.EventCancelled, audit.EventDenied, audit.EventApprovalRequested:
			go awaitEnvelope()
		}
		return true
	})
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer unsub()
	// What was stored between the page's render and the subscription.
	after, _ := strconv.ParseUint(r.URL.Query().Get("after"), 10, 64)
	if trail, err := audit.Read(ctx, b, owner, id); err == nil && trail[len(trail)-1].Seq > after {
		notify(changed)
	}
	// The page may show the last event but not yet the envelope it announced.
	if r.URL.Query().Get("ended") == "" {
		go awaitEnvelope()
	}
	followed(owner)
	events(w, r, s.done, settleApprovals, changed, failed, progress)
}
