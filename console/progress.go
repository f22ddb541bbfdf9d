package console

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/nats-io/nats.go"
)

// An execution's page shows how far its handler has got (DESIGN §5,
// "Progress"): rendered from the record (the last report as of the lease's
// last renewal), then live, for a session that may receive the execution's
// progress, from what the worker publishes on its owner's progress subject:
// each report reaches the page as a "progress" event that carries it, and the
// script updates the progress card in place, without reading the execution
// again. Reports are already coalesced by the worker (at most four a second);
// the stream sends at most one per settleProgress whatever arrives, the
// latest.
const settleProgress = 250 * time.Millisecond

// progressView is a report as the page's script shows it.
type progressView struct {
	Attempt int     `json:"attempt"`
	Done    float64 `json:"done"`
	Total   float64 `json:"total"`
	// Text is the report for a person ("37 of 120 (30%): rendering").
	Text string `json:"text"`
	// At is when the handler reported it, as the page's time elements
	// carry it (datetime) and show it.
	At     string `json:"at"`
	AtText string `json:"atText"`
}

func viewOf(p *envelope.Progress) progressView {
	return progressView{Attempt: p.Attempt, Done: p.Done, Total: p.Total, Text: p.String(),
		At: funcs["iso"].(func(time.Time) string)(p.At), AtText: funcs["ts"].(func(time.Time) string)(p.At)}
}

// mayFollowProgress says whether the session may receive the progress of
// owner's executions: an admin or an open server any principal's, a
// producer its own. An approver may not (its page shows the record's).
func (s *session) mayFollowProgress(owner string) bool {
	switch {
	case s.broker() != nil:
		return true
	case s.client != nil && !s.p.open:
		return owner == "" || owner == s.p.Name
	}
	return false
}

// followProgress subscribes to the progress of owner's execution id and
// keeps the latest report, as the page shows it, in latest (a buffer of
// one: an older one waiting is replaced). It returns the unsubscription.
func followProgress(nc *nats.Conn, names broker.Names, owner, id string, latest chan []byte) (func(), error) {
	subject := names.ProgressSubject(owner, id)
	sub, err := nc.Subscribe(subject, func(m *nats.Msg) {
		p, err := envelope.DecodeProgress(m.Data)
		if err != nil || p.ExecutionID != id || m.Subject != subject {
			return
		}
		// Whoever published it (an open server keeps no one out), the page
		// shows one printable line: DecodeProgress cleaned the message.
		b, err := json.Marshal(viewOf(p))
		if err != nil {
			return
		}
		for {
			select {
			case latest <- b:
				return
			default:
			}
			select {
			case <-latest:
			default:
			}
		}
	})
	if err != nil {
		return nil, err
	}
	_ = sub.SetPendingLimits(256, 1<<20)
	return func() { _ = sub.Unsubscribe() }, nil
}

// progressSender writes "progress" events: the latest report, at most one
// per settleProgress.
type progressSender struct {
	pending []byte
	last    time.Time
	due     <-chan time.Time
}

// offer takes a report: it goes when the last one has been out for
// settleProgress.
func (ps *progressSender) offer(b []byte) {
	ps.pending = b
	if ps.due == nil {
		ps.due = time.After(max(0, time.Until(ps.last.Add(settleProgress))))
	}
}

// send writes the pending report.
func (ps *progressSender) send(w http.ResponseWriter, fl http.Flusher) {
	ps.due = nil
	if ps.pending == nil {
		return
	}
	_, _ = fmt.Fprintf(w, "event: progress\ndata: %s\n\n", ps.pending)
	fl.Flush()
	ps.pending, ps.last = nil, time.Now()
}
