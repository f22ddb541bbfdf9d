package executor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/capstan-dev/capstan/execution"

	"github.com/nats-io/nats.go"

	"github.com/capstan-dev/capstan/auth"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor/internal/engine"
	"github.com/capstan-dev/capstan/internal/approvalsrpc"
	"github.com/capstan-dev/capstan/internal/broker"
)

// CancelReply answers a cancel request.
type CancelReply struct {
	// ExecutionID is the execution cancelled.
	ExecutionID string `json:"executionId"`
	// State is the record's state when the cancel was recorded.
	State execution.State `json:"state,omitempty"`
	// Finalized is true when the execution had ended before the cancel, which
	// then changed nothing; Status is its envelope's. A running execution is
	// stopped once the cancel is recorded.
	Finalized bool            `json:"finalized,omitempty"`
	Status    envelope.Status `json:"status,omitempty"` // set with Finalized
	// Error is the refusal, if the cancel was refused.
	Error string `json:"error,omitempty"`
	// Conditions name a refusal's kind: quota_exceeded; unknown when
	// nothing of the execution is stored (no request in its queue, no
	// record, no envelope), and nothing was recorded.
	Conditions []string `json:"conditions,omitempty"`
	// Details are a refusal's facts: for quota_exceeded, the quota, its
	// limit and retryAfterMs (envelope.QuotaExceeded).
	Details map[string]any `json:"details,omitempty"`
}

// serveControl subscribes to the core NATS requests workers serve. Each
// request passes its principal's controlPerSecond quota, then waits for its
// turn on the control gate (quotas.go).
func (w *Worker) serveControl() ([]*nats.Subscription, error) {
	n := w.b.Names
	var subs []*nats.Subscription
	add := func(s *nats.Subscription, err error) error {
		if err != nil {
			for _, s := range subs {
				_ = s.Unsubscribe()
			}
			return err
		}
		subs = append(subs, s)
		return nil
	}
	// One worker of the group records the cancel on the execution record ...
	if err := add(w.nc.QueueSubscribe(n.CancelSubjects(), n.WorkersQueue(), w.gated(w.recordCancel, w.refuseCancel))); err != nil {
		return nil, err
	}
	// ... and every worker stops its own run of it at once, if it has one, on
	// the notice sent once the cancel is recorded. The server also sends
	// messages to these subjects on a producer's behalf (as the reply of a
	// request it makes), so a notice is only a prompt: CancelLocal stops the
	// run only if the execution's record says it was cancelled. A run that
	// begins after the cancel was recorded sees it on the record when it
	// claims.
	stopLocal := func(m *nats.Msg) {
		if p := n.PrincipalOfSubject(m.Subject); p != "" {
			w.run.CancelLocal(p, lastToken(m.Subject))
		}
	}
	if err := add(w.nc.Subscribe(n.CancelNoticeSubjects(), stopLocal)); err != nil {
		return nil, err
	}
	// Every worker confirms the operators' changes it applied (pause.go).
	if err := add(w.nc.Subscribe(n.AppliedSubject(), w.serveApplied)); err != nil {
		return nil, err
	}
	if err := add(w.nc.QueueSubscribe(n.DescribeSubjects(), n.WorkersQueue(), w.gated(w.serveDescribe, w.refuseDescribe))); err != nil {
		return nil, err
	}
	// Decisions and listings: the approver is the principal of the subject.
	store := w.approvalStore()
	if err := add(w.nc.QueueSubscribe(n.DecideSubjects(), n.WorkersQueue(),
		w.gated(approvalsrpc.DecideHandler(store, n, w.grants), w.refuseDecision))); err != nil {
		return nil, err
	}
	if err := add(w.nc.QueueSubscribe(n.ListApprovalsSubjects(), n.WorkersQueue(),
		w.gated(approvalsrpc.ListHandler(store, w.approvalIndex, n, w.grants, w.replyBound), w.refuseApprovals))); err != nil {
		return nil, err
	}
	// Executions, read on a principal's behalf (executions.go).
	if err := add(w.nc.QueueSubscribe(n.ListExecutionsSubjects(), n.WorkersQueue(), w.gated(w.serveExecutions, w.refuseExecutions))); err != nil {
		return nil, err
	}
	if err := add(w.nc.QueueSubscribe(n.ExecutionSubjects(), n.WorkersQueue(), w.gated(w.serveExecution, w.refuseExecution))); err != nil {
		return nil, err
	}
	return subs, nil
}

func lastToken(subject string) string {
	return subject[strings.LastIndexByte(subject, '.')+1:]
}

// CancelRequest is the optional body of a cancel. Owner is read for admins
// only: an admin cancels another principal's execution by naming its owner.
type CancelRequest struct {
	// Owner is the principal whose execution it is (admins only).
	Owner string `json:"owner,omitempty"`
}

// recordCancel answers a cancel request: one worker of the group records it
// on the execution's record (engine.Runner.RecordCancel), then every
// worker is told to stop its own run of it. A principal cancels only its own
// executions: the record is the one under the principal of the subject,
// whatever the body says.
func (w *Worker) recordCancel(m *nats.Msg) {
	principal, id := w.b.Names.PrincipalOfSubject(m.Subject), lastToken(m.Subject)
	if !w.b.Names.ReplyAllowed(principal, m.Reply) {
		return // an answer aimed at someone else's subject: not served
	}
	reply := CancelReply{ExecutionID: id}
	defer func() {
		if reply.Error == "" && !reply.Finalized {
			// This worker hears of it before the caller does: a read it
			// holds queued, which reads the record only when noticed, obeys
			// the cancel however late its own notice comes back.
			w.run.CancelLocal(principal, id)
			_ = w.nc.Publish(w.b.Names.CancelNoticeSubject(principal, id), nil)
		}
		w.respondJSON(m, reply)
	}()
	if err := envelope.ValidExecutionID(id); err != nil || principal == "" {
		reply.Error = "invalid cancel subject"
		if err != nil {
			reply.Error = err.Error()
		}
		return
	}
	var req CancelRequest
	if len(m.Data) > 0 && json.Unmarshal(m.Data, &req) == nil && req.Owner != "" && req.Owner != principal {
		if g, ok := w.grants.Lookup(principal); !ok || g.Role != auth.RoleAdmin || !broker.ValidPrincipal(req.Owner) {
			reply.Error = "only an admin cancels another principal's execution"
			return
		}
		principal = req.Owner
	}
	c, err := w.run.RecordCancel(principal, id, w.mayBeQueued(principal, id))
	if errors.Is(err, engine.ErrNothingToCancel) {
		reply.Error, reply.Conditions = fmt.Sprintf("%v: %s: nothing of it is stored, and nothing was recorded", ErrNoSuchExecution, id), []string{"unknown"}
		return
	}
	if err != nil {
		reply.Error = err.Error()
		return
	}
	reply.State, reply.Finalized, reply.Status = c.State, c.Finalized, c.Status
}

// mayBeQueued tells a cancel whether principal's execution id may be waiting
// in its queue, which it reads before the record (see
// engine.Runner.RecordCancel): it has a record already (the common case, no
// queue read), its request is in the queue, it was made less than
// probeAfter ago (its request may be on its way), or the queue could not be
// read to the end.
func (w *Worker) mayBeQueued(principal, id string) bool {
	if made, ok := envelope.ExecutionIDTime(id); ok && time.Since(made) < probeAfter {
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), readTimeout)
	defer cancel()
	if _, err := w.b.Executions.Get(ctx, broker.Key(principal, id)); err == nil {
		return true
	}
	streams, err := queueStreamsOf(ctx, w.b, principal)
	if err != nil {
		return true
	}
	for _, stream := range streams {
		queued, _, certain, err := queuedIn(ctx, w.b, stream, w.b.Names.ExecSubject(principal, ">"), id)
		if err != nil || queued || !certain {
			return true
		}
	}
	return false
}

func (w *Worker) respondJSON(m *nats.Msg, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		w.log.Error("reply does not encode", "subject", m.Subject, "err", err)
		return
	}
	_ = m.Respond(b)
}
