package executor

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor/internal/engine"
	"github.com/capstan-dev/capstan/internal/oplog"
	"github.com/capstan-dev/capstan/internal/pauses"
)

// Operators' pauses (DESIGN §18): the worker watches the pauses bucket,
// which admins write (capstan pause), and answers the engine's question
// before every attempt from that copy. A pause that refuses ends a call
// after the stages that conceal (so that it tells nothing of a capability
// the caller may not see), before its policies and approvals; one that
// holds is the engine's to carry out. A pause asking for it cancels the
// running attempts it matches; every worker confirms to the operator's
// command that it applied a change.

// PauseInfo tells a caller that an operator paused a capability for it
// (Descriptor.Paused): its calls wait in their queue until the pause is
// lifted, or, with Refuse, end at once with the code PAUSED.
type PauseInfo struct {
	// Refuse: calls end PAUSED at once; otherwise they wait.
	Refuse bool `json:"refuse,omitempty"`
	// Reason is the operator's.
	Reason string `json:"reason"`
	// Since is when it was paused.
	Since time.Time `json:"since"`
}

// pauseOf is the operators' pause that stops a call of capabilityID by
// principal as actor, nil when none does.
func (w *Worker) pauseOf(principal, capabilityID string, actor envelope.Actor) *pauses.Pause {
	return w.pauses.Load().Match(principal, capabilityID, actor)
}

// paused answers the engine (engine.Config.Paused).
func (w *Worker) paused(principal string, req *envelope.Request) *engine.Pause {
	if w.pauses.Load() == nil {
		return nil // no pause: the common case, one load
	}
	changed := w.pauses.Changed() // taken first, so that no change is missed
	p := w.pauseOf(principal, req.CapabilityID, req.Actor)
	if p == nil {
		return nil
	}
	ep := &engine.Pause{Changed: changed, Data: p.Data()}
	if p.Mode == pauses.Refuse {
		ep.Refusal = p.Refusal()
	}
	return ep
}

// pauseInfo is what describe tells a caller of a pause.
func pauseInfo(p *pauses.Pause) *PauseInfo {
	if p == nil {
		return nil
	}
	return &PauseInfo{Refuse: p.Mode == pauses.Refuse, Reason: p.Reason, Since: p.At}
}

// cancelPasses are the cancellations of running attempts pauses asked this
// worker for, by the pause's audit id: at most one pass per pause, its
// count kept for the operator's confirmation.
type cancelPasses struct {
	mu     sync.Mutex
	passes map[string]*cancelPass
	order  []string
}

type cancelPass struct {
	done      chan struct{}
	cancelled int
}

// maxCancelPasses bounds the passes remembered.
const maxCancelPasses = 64

// onPause is told of every pause the watcher reads: one that asks for it
// has this worker's running attempts it matches cancelled, once.
func (w *Worker) onPause(p *pauses.Pause) {
	if !p.CancelRunning {
		return
	}
	cp := &w.cancels
	cp.mu.Lock()
	if cp.passes == nil {
		cp.passes = map[string]*cancelPass{}
	}
	if _, done := cp.passes[p.AuditID]; done {
		cp.mu.Unlock()
		return
	}
	pass := &cancelPass{done: make(chan struct{})}
	cp.passes[p.AuditID] = pass
	cp.order = append(cp.order, p.AuditID)
	if len(cp.order) > maxCancelPasses {
		delete(cp.passes, cp.order[0])
		cp.order = cp.order[1:]
	}
	cp.mu.Unlock()
	go func() {
		defer close(pass.done)
		pass.cancelled = w.run.CancelRunning(func(principal string, req *envelope.Request) bool {
			return p.Scope.Matches(principal, req.CapabilityID, req.Actor)
		}, p.Reason)
		if pass.cancelled > 0 {
			w.log.Warn("running attempts cancelled by an operator's pause", "pause", p.Scope.String(),
				"cancelled", pass.cancelled, "reason", p.Reason, "auditId", p.AuditID)
		}
	}()
}

// cancelled waits for the cancel pass of the pause filed under auditID,
// if there is one, and returns its count.
func (w *Worker) cancelled(ctx context.Context, auditID string) int {
	cp := &w.cancels
	cp.mu.Lock()
	pass := cp.passes[auditID]
	cp.mu.Unlock()
	if pass == nil {
		return 0
	}
	select {
	case <-pass.done:
		return pass.cancelled
	case <-ctx.Done():
		return 0
	}
}

// noneStarting waits until no attempt of this worker that the pauses now in
// place stop is starting (past its gate, read before they changed, its
// handler not begun), and reports whether none is. A pause that cancels
// ends such attempts; one that holds lets them begin, as it lets the
// running attempts go on; either way, once the worker confirms, it starts
// nothing the pauses stop.
func (w *Worker) noneStarting(ctx context.Context) bool {
	paused := func(principal string, req *envelope.Request) bool {
		return w.pauseOf(principal, req.CapabilityID, req.Actor) != nil
	}
	for w.run.Starting(paused) > 0 {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(5 * time.Millisecond):
		}
	}
	return true
}

// serveApplied answers an operator's command: once this worker's copy of
// the bucket asked about has the revision asked for (or
// oplog.AnswerWithin passed), with what it holds and what it cancelled. It answers on an inbox
// only: the subject carries no principal, and only the capstan account's
// users (admins, workers) reach it.
func (w *Worker) serveApplied(m *nats.Msg) {
	if !strings.HasPrefix(m.Reply, "_INBOX") {
		return
	}
	var req oplog.AppliedRequest
	if envelope.Unmarshal(m.Data, &req) != nil {
		return
	}
	var copyOf *oplog.Follower
	switch req.Bucket {
	case oplog.Pauses:
		copyOf = w.pauses.Follower
	case oplog.Policies:
		copyOf = w.policies.Follower
	default:
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(w.run.Context(), oplog.AnswerWithin)
		defer cancel()
		applied := copyOf.WaitRevision(ctx, req.Revision) == nil
		if applied && req.Bucket == oplog.Pauses {
			applied = w.noneStarting(ctx)
		}
		reply := oplog.AppliedReply{V: envelope.Version, Worker: w.cfg.ID, Revision: copyOf.Revision(), Applied: applied,
			Pauses: w.pauses.Load().Len()}
		if s := w.policies.Load(); s != nil {
			reply.PolicyVersion = s.Version
			if err := s.Err(); err != nil {
				reply.PolicyError = err.Error()
			}
		}
		if applied && req.Bucket == oplog.Pauses && req.AuditID != "" {
			reply.Cancelled = w.cancelled(ctx, req.AuditID)
		}
		if b, err := envelope.Marshal(&reply); err == nil {
			_ = m.Respond(b)
		}
	}()
}
