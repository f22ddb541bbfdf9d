package mcpbridge

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/capstan-dev/capstan/audit"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// progress sends a call's progress notifications, when the client asked for
// them with a progress token.
type progress struct {
	session *mcp.ServerSession
	token   any

	mu sync.Mutex
	n  float64
}

func newProgress(req *mcp.CallToolRequest) *progress {
	p := &progress{session: req.Session}
	if req.Params != nil {
		p.token = req.Params.GetProgressToken()
	}
	return p
}

// send notifies one step; the progress value grows by one each time.
func (p *progress) send(ctx context.Context, msg string) {
	if p == nil || p.token == nil || p.session == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.n++
	_ = p.session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: p.token, Progress: p.n, Message: msg})
}

// drainWait bounds how long a call's answer waits for the last steps of its
// trail: audit events are written after the envelope (asynchronously).
const drainWait = 3 * time.Second

// follow notifies the execution's steps as its audit trail records them
// (queued, waiting for approval, started attempt n, retrying). stop waits,
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
		err := audit.Follow(ctx, b.c.Broker(), audit.Filter{ExecutionID: executionID}, func(ev audit.Event) error {
			if msg := stepOf(ev); msg != "" {
				p.send(ctx, msg)
			}
			if lastStep(ev) {
				once.Do(func() { close(last) })
			}
			return nil
		}, audit.FromStart())
		if err != nil && ctx.Err() == nil {
			b.log.Debug("progress: following the audit trail failed", "executionId", executionID, "err", err)
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
