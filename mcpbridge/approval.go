package mcpbridge

import (
	"container/list"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/approvalstore"
	"github.com/capstan-dev/capstan/internal/execrpc"
)

// memoryBound bounds the bridge's in-memory maps; the oldest entries go
// first. What they remember is a convenience: the approvals and envelopes
// themselves are in capstan's buckets.
const memoryBound = 10000

// lru is a bounded map from string to string.
type lru struct {
	mu    sync.Mutex
	order *list.List
	items map[string]*list.Element
}

type lruEntry struct{ k, v string }

func (l *lru) init() { l.order, l.items = list.New(), map[string]*list.Element{} }

func (l *lru) put(k, v string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e, ok := l.items[k]; ok {
		e.Value.(*lruEntry).v = v
		l.order.MoveToFront(e)
		return
	}
	l.items[k] = l.order.PushFront(&lruEntry{k, v})
	if l.order.Len() > memoryBound {
		last := l.order.Back()
		l.order.Remove(last)
		delete(l.items, last.Value.(*lruEntry).k)
	}
}

func (l *lru) get(k string) (string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.items[k]
	if !ok {
		return "", false
	}
	return e.Value.(*lruEntry).v, true
}

func (l *lru) del(k string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e, ok := l.items[k]; ok {
		l.order.Remove(e)
		delete(l.items, k)
	}
}

// pendingApprovals remembers which approval a call (actor, capability,
// canonical input) is waiting for.
type pendingApprovals struct{ lru }

func pendingKey(actor envelope.Actor, capID string, input envelope.Raw) string {
	_, hash, err := approvalstore.Canonical(input)
	if err != nil {
		return ""
	}
	return actor.String() + "\x00" + capID + "\x00" + hash
}

func (p *pendingApprovals) remember(key, approvalID string) { p.put(key, approvalID) }

func (p *pendingApprovals) lookup(key string) (string, bool) {
	if key == "" {
		return "", false
	}
	return p.get(key)
}

// executionIDFor returns a new execution id that names its actor: a UUIDv7,
// then a tag derived from it and the actor. The bridge answers an execution
// only to the actor its id's tag names, after a restart too, without reading
// anything: the bridge's principal is a producer, which reads no audit trail
// and no approvals bucket. The tag needs no secret: an actor cannot make
// another's id carry its own tag, and the id is part of the execution's key.
func executionIDFor(actor envelope.Actor) string {
	u := envelope.NewExecutionID()
	return u + "-" + actorTag(actor, u)
}

const (
	uuidLen = 36
	tagLen  = 32
)

func actorTag(actor envelope.Actor, u string) string {
	h := sha256.Sum256([]byte(u + "\x00" + actor.String()))
	return hex.EncodeToString(h[:tagLen/2])
}

// owns reports whether actor started the execution id. An id without a tag
// (from a bridge older than them) is judged on its audit trail, where the
// bridge's principal may read it: its requester is the actor.
func (b *Bridge) owns(ctx context.Context, actor envelope.Actor, id string) bool {
	if tagged(id) {
		u, tag := id[:uuidLen], id[uuidLen+1:]
		return subtle.ConstantTimeCompare([]byte(tag), []byte(actorTag(actor, u))) == 1
	}
	trail, err := b.c.Trail(ctx, id)
	if err != nil {
		return false
	}
	for _, ev := range trail {
		if ev.Type == audit.EventRequested {
			return ev.Actor.Kind == actor.Kind && ev.Actor.ID == actor.ID
		}
	}
	return false
}

// approval reads an approval through the listing the workers serve: they
// show a principal the approvals it requested itself (on an open server,
// every one). An approval the bridge's principal did not request is not
// found.
func (b *Bridge) approval(ctx context.Context, id string) (*approvals.Record, error) {
	ctx, cancel := context.WithTimeout(ctx, submitTimeout)
	defer cancel()
	page, err := b.c.ListApprovals(ctx, approvals.ListRequest{ID: id})
	switch {
	case errors.Is(err, approvals.ErrForbidden) || errors.Is(err, approvals.ErrNotFound):
		return nil, fmt.Errorf("%w: %s", approvals.ErrNotFound, id)
	case err != nil:
		return nil, err
	case len(page.Records) != 1 || page.Records[0].ID != id:
		return nil, fmt.Errorf("%w: %s", approvals.ErrNotFound, id)
	}
	return page.Records[0], nil
}

// resume answers capstan.resume.
func (b *Bridge) resume(ctx context.Context, actor envelope.Actor, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	var in struct {
		ApprovalID string `json:"approvalId"`
	}
	if err := json.Unmarshal(req.Params.Arguments, &in); err != nil || in.ApprovalID == "" {
		return refusal(envelope.CodeInputInvalid, "Give the approvalId of an approval-required result."), nil
	}
	return b.resumeApproval(ctx, actor, in.ApprovalID, newProgress(req), false)
}

// resumeApproval runs an approved call once, for the actor who asked for it
// on the mcp surface. A pending approval answers approval-required again
// when skipPending, without a new execution; every other status is left to
// the worker, which ends the execution with the matching APPROVAL_* code.
func (b *Bridge) resumeApproval(ctx context.Context, actor envelope.Actor, approvalID string, p *progress, skipPending bool) (*mcp.CallToolResult, error) {
	rec, err := b.approval(ctx, approvalID)
	switch {
	case errors.Is(err, approvals.ErrNotFound):
		return refusal(envelope.CodeForbidden, "No such approval."), nil
	case quotaRefusal(err) != nil:
		return quotaRefusal(err), nil
	case err != nil:
		return nil, err
	}
	if rec.Actor.Kind != actor.Kind || rec.Actor.ID != actor.ID || rec.Surface != string(executor.SurfaceMCP) {
		// Another actor's approval, or one asked for elsewhere: the same
		// answer as an unknown one.
		return refusal(envelope.CodeForbidden, "No such approval."), nil
	}
	if skipPending && rec.StatusAt(time.Now()) == approvals.StatusPending {
		return resultOf(&envelope.Envelope{V: envelope.Version, ExecutionID: rec.RequestedBy, CapabilityID: rec.CapabilityID,
			Status:   envelope.StatusApprovalRequired,
			Approval: &envelope.ApprovalRef{ID: rec.ID, Reasons: rec.Reasons, Types: rec.Types, ExpiresAt: rec.ExpiresAt}}), nil
	}
	b.pending.del(pendingKey(actor, rec.CapabilityID, mustRaw(rec.Input)))
	return b.run(ctx, actor, p, "", func(ctx context.Context, id string) error {
		_, err := b.c.SubmitResume(ctx, approvalID, executor.WithID(id))
		return err
	})
}

func mustRaw(j json.RawMessage) envelope.Raw {
	r, err := envelope.RawFromJSON(j)
	if err != nil {
		return nil
	}
	return r
}

// awaitDecision waits up to Config.ApprovalWait for someone to decide the
// approval, telling the caller it waits, and reports whether it was
// approved.
func (b *Bridge) awaitDecision(ctx context.Context, p *progress, approvalID string) bool {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.ApprovalWait)
	defer cancel()
	p.send(ctx, "waiting for approval "+approvalID)
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		rec, err := b.approval(ctx, approvalID)
		if err == nil {
			switch rec.StatusAt(time.Now()) {
			case approvals.StatusApproved:
				p.send(ctx, "approved by "+decider(rec))
				return true
			case approvals.StatusPending:
			default:
				return false
			}
		}
		select {
		case <-ctx.Done():
			return false
		case <-tick.C:
		}
	}
}

func decider(r *approvals.Record) string {
	if r.Decision == nil {
		return "an approver"
	}
	return r.Decision.Approver.String()
}

// status answers capstan.status.
func (b *Bridge) status(ctx context.Context, actor envelope.Actor, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	var in struct {
		ExecutionID string `json:"executionId"`
	}
	if err := json.Unmarshal(req.Params.Arguments, &in); err != nil || envelope.ValidExecutionID(in.ExecutionID) != nil {
		return refusal(envelope.CodeInputInvalid, "Give the executionId of a call you made."), nil
	}
	if !b.owns(ctx, actor, in.ExecutionID) {
		return refusal(envelope.CodeCapabilityNotFound, "No such execution."), nil
	}
	st, err := b.c.Status(execrpc.TakeAbsenceAsQueued(ctx), in.ExecutionID)
	if errors.Is(err, executor.ErrNoSuchExecution) {
		// The actor's own (owns said so), stored, and no worker has taken it
		// yet: it is queued. (One whose result is no longer kept is ErrExpired.)
		res := stillRunning(in.ExecutionID, 0)
		res.Content = []mcp.Content{&mcp.TextContent{Text: "Execution " + in.ExecutionID + " is queued: no worker has taken it yet; call " +
			StatusTool + " again later."}}
		return res, nil
	}
	if r := quotaRefusal(err); r != nil {
		return r, nil
	}
	if err != nil {
		return nil, err
	}
	if st.Envelope != nil {
		return resultOf(st.Envelope), nil
	}
	res := stillRunning(in.ExecutionID, 0)
	if st.Record != nil {
		res.Content = []mcp.Content{&mcp.TextContent{Text: "Execution " + in.ExecutionID + " is " + string(st.Record.State) +
			"; call " + StatusTool + " again later."}}
	}
	return res, nil
}
