package mcpbridge

import (
	"context"
	"fmt"
	"sync"

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

// follow notifies the execution's steps as its audit trail records them
// (queued, waiting for approval, started attempt n, retrying), until stop is
// called; stop returns once no notification can follow, so none arrives
// after the call's result.
func (p *progress) follow(ctx context.Context, b *Bridge, executionID string) (stop func()) {
	if p.token == nil {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		err := audit.Follow(ctx, b.c.Broker(), audit.Filter{ExecutionID: executionID}, func(ev audit.Event) error {
			if msg := stepOf(ev); msg != "" {
				p.send(ctx, msg)
			}
			return nil
		}, audit.FromStart())
		if err != nil && ctx.Err() == nil {
			b.log.Debug("progress: following the audit trail failed", "executionId", executionID, "err", err)
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { cancel(); <-done }) }
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
