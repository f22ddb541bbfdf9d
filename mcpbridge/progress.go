package mcpbridge

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/capstan-dev/capstan/execution"
	"github.com/capstan-dev/capstan/internal/execrpc"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
)

// progress sends a call's progress notifications, when the client asked for
// them with a progress token: the execution's steps (queued, started,
// retrying, waiting for an approval) and what its handler reports of its
// work (DESIGN §5 "Progress").
type progress struct {
	session *mcp.ServerSession
	token   any

	mu    sync.Mutex
	scale progressScale
	said  map[string]bool
}

func newProgress(req *mcp.CallToolRequest) *progress {
	p := &progress{session: req.Session}
	if req.Params != nil {
		p.token = req.Params.GetProgressToken()
	}
	return p
}

// progressScale makes the values of one call's notifications. MCP asks that
// each value be greater than the last; a total makes a client show a bar.
// The work the handler reports sets the values (done of total), so that the
// bar says how far the work has got; the runtime's own steps move the value
// by a negligible stepValue only, and the step that ends the call fills the
// bar; a report of the whole total stops a step short of it, so that the end
// still grows the value and no value passes its total. A report that would
// not move the value forward (a retry's, which starts again) moves it by a
// step: the bar never goes back.
type progressScale struct {
	last  float64 // the last value sent
	total float64 // the last total the handler reported (0: none yet)
	// ended: the step that ends the call was sent; a report that comes
	// after it (published before the envelope, delivered after the trail's
	// last step) is not sent.
	ended bool
	// worked is the latest attempt the handler reported from (0: none): a
	// step that precedes its work (queued; started, attempt n), arriving
	// after it, is not sent. The trail and the reports travel apart, and
	// "queued" after "1 of 10" would read backwards.
	worked int
}

// stale reports whether a step that precedes attempt n's work comes after
// a report of that attempt or a later one (n 0: a step no report makes stale).
func (s *progressScale) stale(n int) bool { return n > 0 && n <= s.worked }

// stepValue is how far one of the runtime's steps moves the value.
const stepValue = 1.0 / 1024

// step is the value and total of a step of the runtime's; final fills the
// bar when a total is known.
func (s *progressScale) step(final bool) (value, total float64) {
	v := s.last + stepValue
	if final && s.total > v {
		v = s.total
	}
	if s.total > 0 && v > s.total {
		// No room left below the total (the handler reported it more than
		// once): the total follows, and the bar stays full.
		s.total = v
	}
	s.last, s.ended = v, s.ended || final
	return v, s.total
}

// report is the value and total of a report of the handler's; ok is false
// once the call's end was sent: nothing more is.
func (s *progressScale) report(done, total float64, attempt int) (value, tot float64, ok bool) {
	if s.ended {
		return 0, 0, false
	}
	s.worked = max(s.worked, attempt, 1)
	v := max(done, s.last+stepValue)
	if room := total - stepValue; total > 0 && v > room && room > s.last {
		// The handler says it is done (or past its total) before the call
		// has ended: the bar stops a step short, for the step that ends the
		// call to fill it and still grow.
		v = room
	}
	if total > 0 {
		s.total = max(total, v)
	}
	s.last = v
	return v, s.total, true
}

// send notifies one step, once.
func (p *progress) send(ctx context.Context, msg string) { p.sendBefore(ctx, msg, 0) }

// sendBefore notifies, once, a step that precedes attempt n's work (queued:
// 1; started, attempt n: n; 0 for any other), unless the handler's report of
// that attempt or a later one was sent already.
func (p *progress) sendBefore(ctx context.Context, msg string, n int) {
	if p == nil || p.token == nil || p.session == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.said[msg] || p.scale.stale(n) {
		return
	}
	if p.said == nil {
		p.said = map[string]bool{}
	}
	p.said[msg] = true
	v, total := p.scale.step(finalStep(msg))
	_ = p.session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: p.token, Progress: v, Total: total, Message: msg})
}

// sendReport notifies what the handler reported.
func (p *progress) sendReport(ctx context.Context, r executor.Progress) {
	if p == nil || p.token == nil || p.session == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	v, total, ok := p.scale.report(r.Done, r.Total, r.Attempt)
	if !ok {
		return
	}
	_ = p.session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: p.token, Progress: v, Total: total,
		Message: reportText(&r)})
}

// finalStep reports whether a step's message ends the call.
func finalStep(msg string) bool {
	switch msg {
	case "completed", "failed", "cancelled":
		return true
	}
	return false
}

// reportText is a handler's report as a notification or a task's status
// message says it: "37 of 120 (30%): page 37", with the attempt after the
// first.
func reportText(r *executor.Progress) string { return r.Line("working") }

// drainWait bounds how long a call's answer waits for the last steps of its
// trail: audit events are written after the envelope (asynchronously).
const drainWait = 3 * time.Second

// follow notifies what the execution's handler reports of its work, and the
// execution's steps as its audit trail records them (queued, waiting for
// approval, started attempt n, retrying), or, when the
// bridge may not read the audit stream (Config.ProgressFromRecords, or a
// refused follow), as its execution record shows them. stop waits,
// at most drainWait, for the trail's last step, then stops following; once it
// returns no notification can follow, so none arrives after the result.
func (p *progress) follow(ctx context.Context, b *Bridge, executionID string) (stop func()) {
	if p.token == nil {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	last := make(chan struct{})
	// What the handler reports, from before the request is published.
	reports, err := b.c.Progress(ctx, executionID)
	if err != nil {
		b.log.Debug("progress: the handler's reports are not followed", "executionId", executionID, "err", err)
	}
	reported := make(chan struct{})
	go func() {
		defer close(reported)
		if reports == nil {
			return
		}
		for r := range reports { // closed when ctx ends
			p.sendReport(ctx, r)
		}
	}()
	go func() {
		defer close(done)
		var once sync.Once
		if b.cfg.ProgressFromRecords {
			p.poll(ctx, b, executionID, func() { once.Do(func() { close(last) }) })
			return
		}
		err := b.c.FollowTrail(ctx, executionID, func(ev audit.Event) error {
			if msg := stepOf(ev); msg != "" {
				p.sendBefore(ctx, msg, precedes(ev))
			}
			if lastStep(ev) {
				once.Do(func() { close(last) })
			}
			return nil
		}, audit.FromStart())
		if err != nil && ctx.Err() == nil {
			b.log.Debug("progress: following the audit trail failed; polling the record", "executionId", executionID, "err", err)
			p.poll(ctx, b, executionID, func() { once.Do(func() { close(last) }) })
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			t := time.NewTimer(drainWait)
			select {
			case <-last:
			case <-done:
			case <-t.C:
			case <-ctx.Done():
			}
			t.Stop()
			cancel()
			<-done
			<-reported
		})
	}
}

// lastStep reports whether ev ends an execution's trail as far as its caller
// is told: its end, or the request for an approval.
func lastStep(ev audit.Event) bool {
	switch ev.Type {
	case audit.EventCompleted, audit.EventFailed, audit.EventCancelled, audit.EventApprovalRequested, audit.EventDenied:
		return true
	}
	return false
}

// stepOf is the progress message of an audit event, or "" for events that
// are not steps of the execution.
func stepOf(ev audit.Event) string {
	switch ev.Type {
	case audit.EventRequested:
		return "queued (execution " + ev.ExecutionID + ")"
	case audit.EventApprovalRequested:
		return fmt.Sprintf("waiting for approval %v", ev.Data["approvalId"])
	case audit.EventApproved:
		return "approved"
	case audit.EventRejected:
		return "rejected"
	case audit.EventStarted:
		return fmt.Sprintf("started, attempt %v", ev.Data["attempt"])
	case audit.EventRetried:
		return fmt.Sprintf("retrying: attempt %v after %v", ev.Data["attempt"], ev.Data["previousErrorCode"])
	case audit.EventTakenOver:
		return "taken over by another worker"
	case audit.EventCompleted:
		return "completed"
	case audit.EventFailed:
		return "failed"
	case audit.EventCancelled:
		return "cancelled"
	}
	return ""
}

// precedes is the attempt whose work the event's step comes before: 1 for
// the request, n for attempt n's start, 0 for any other event.
func precedes(ev audit.Event) int {
	switch ev.Type {
	case audit.EventRequested:
		return 1
	case audit.EventStarted:
		n, _ := strconv.Atoi(fmt.Sprint(ev.Data["attempt"]))
		return n
	}
	return 0
}

// pollEvery is how often progress reads an execution's record when it
// cannot follow the audit trail.
const pollEvery = 250 * time.Millisecond

// poll notifies the record's states until the envelope exists or ctx ends.
func (p *progress) poll(ctx context.Context, b *Bridge, executionID string, ended func()) {
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for {
		st, err := b.c.Status(execrpc.TakeAbsenceAsQueued(ctx), executionID)
		switch {
		case errors.Is(err, executor.ErrNoSuchExecution):
			p.sendBefore(ctx, "queued (execution "+executionID+")", 1)
		case err != nil:
		case st.Envelope != nil:
			if st.Envelope.Status == envelope.StatusApprovalRequired && st.Envelope.Approval != nil {
				p.send(ctx, "waiting for approval "+st.Envelope.Approval.ID)
			} else {
				p.send(ctx, string(st.Envelope.Status))
			}
			ended()
			return
		default:
			p.sendBefore(ctx, "queued (execution "+executionID+")", 1)
			if st.Record != nil && st.Record.State != execution.StatePending && st.Record.State != execution.StateClaimed {
				p.send(ctx, stateText(st.Record))
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// liveProgress keeps the last report of each of the bridge principal's
// executions that reported lately, for the tasks' status messages: a task is
// polled (tasks/get), and the record holds a report only as of its lease's
// last renewal. It follows the principal's progress subjects from the first
// task on, and keeps at most maxLive executions, the most recent.
type liveProgress struct {
	once sync.Once
	mu   sync.Mutex
	last map[string]executor.Progress
}

// maxLive bounds the executions liveProgress keeps.
const maxLive = 4096

// start follows the principal's progress, once.
func (l *liveProgress) start(b *Bridge) {
	l.once.Do(func() {
		l.mu.Lock()
		l.last = map[string]executor.Progress{}
		l.mu.Unlock()
		if err := b.c.WatchProgress(b.ctx, l.put); err != nil {
			b.log.Debug("progress: tasks show the records' progress only", "err", err)
		}
	})
}

func (l *liveProgress) put(p executor.Progress) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.last) >= maxLive {
		// Keep the newest half.
		ats := make([]time.Time, 0, len(l.last))
		for _, q := range l.last {
			ats = append(ats, q.At)
		}
		slices.SortFunc(ats, func(a, b time.Time) int { return a.Compare(b) })
		// At or before the median: at least half goes, even when many
		// reports carry one time (forged ones on an open server may).
		cut := ats[len(ats)/2]
		for id, q := range l.last {
			if !q.At.After(cut) {
				delete(l.last, id)
			}
		}
	}
	l.last[p.ExecutionID] = p
}

// of is the latest report of an execution the record says is running
// attempt (0: not known): the live one, or the record's (rec), whichever is
// of that attempt and newer. nil when there is none.
func (l *liveProgress) of(id string, attempt int, rec *executor.Progress) *executor.Progress {
	l.mu.Lock()
	p, ok := l.last[id]
	l.mu.Unlock()
	best := rec
	if best != nil && attempt > 0 && best.Attempt != attempt {
		best = nil
	}
	if ok && (attempt == 0 || p.Attempt >= attempt) && (best == nil || p.At.After(best.At)) {
		best = &p
	}
	return best
}
