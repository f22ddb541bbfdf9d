package mcpbridge

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/capstan-dev/capstan/execution"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// progress sends a call's progress notifications, when the client asked for
// them with a progress token.
type progress struct {
	session *mcp.ServerSession
	token   any

	mu   sync.Mutex
	n    float64
	said map[string]bool
}

func newProgress(req *mcp.CallToolRequest) *progress {
	p := &progress{session: req.Session}
	if req.Params != nil {
		p.token = req.Params.GetProgressToken()
	}
	return p
}

// send notifies one step, once: the progress value grows by one each time.
func (p *progress) send(ctx context.Context, msg string) {
	if p == nil || p.token == nil || p.session == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.said[msg] {
		return
	}
	if p.said == nil {
		p.said = map[string]bool{}
	}
	p.said[msg] = true
	p.n++
	_ = p.session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: p.token, Progress: p.n, Message: msg})
}

// drainWait bounds how long a call's answer waits for the last steps of its
// trail: audit events are written after the envelope (asynchronously).
const drainWait = 3 * time.Second

// follow notifies the execution's steps as its audit trail records them
// (queued, waiting for approval, started attempt n, retrying), or, when the
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
	go func() {
		defer close(done)
		var once sync.Once
		if b.cfg.ProgressFromRecords {
			p.poll(ctx, b, executionID, func() { once.Do(func() { close(last) }) })
			return
		}
		err := b.c.FollowTrail(ctx, executionID, func(ev audit.Event) error {
			if msg := stepOf(ev); msg != "" {
				p.send(ctx, msg)
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
		})
	}
}

// lastStep reports whether ev ends an execution's trail as far as its caller
// is told: its end, or the request for an approval.
func lastStep(ev audit.Event) bool {
	switch ev.Type {
	case audit.Completed, audit.Failed, audit.Cancelled, audit.ApprovalRequested, audit.Denied:
		return true
	}
	return false
}

// stepOf is the progress message of an audit event, or "" for events that
// are not steps of the execution.
func stepOf(ev audit.Event) string {
	switch ev.Type {
	case audit.Requested:
		return "queued (execution " + ev.ExecutionID + ")"
	case audit.ApprovalRequested:
		return fmt.Sprintf("waiting for approval %v", ev.Data["approvalId"])
	case audit.Approved:
		return "approved"
	case audit.Rejected:
		return "rejected"
	case audit.Started:
		return fmt.Sprintf("started, attempt %v", ev.Data["attempt"])
	case audit.Retried:
		return fmt.Sprintf("retrying: attempt %v after %v", ev.Data["attempt"], ev.Data["previousErrorCode"])
	case audit.TakenOver:
		return "taken over by another worker"
	case audit.Completed:
		return "completed"
	case audit.Failed:
		return "failed"
	case audit.Cancelled:
		return "cancelled"
	}
	return ""
}

// pollEvery is how often progress reads an execution's record when it
// cannot follow the audit trail.
const pollEvery = 250 * time.Millisecond

// poll notifies the record's states until the envelope exists or ctx ends.
func (p *progress) poll(ctx context.Context, b *Bridge, executionID string, ended func()) {
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for {
		st, err := b.c.Status(ctx, executionID)
		switch {
		case errors.Is(err, executor.ErrUnknownExecution):
			p.send(ctx, "queued (execution "+executionID+")")
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
			p.send(ctx, "queued (execution "+executionID+")")
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
