package executor

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/approvalsrpc"
	"github.com/capstan-dev/capstan/internal/approvalstore"
	"github.com/capstan-dev/capstan/internal/auditemit"
	"github.com/capstan-dev/capstan/internal/auditproof"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/pauses"
)

// approvalStore is a store over the approvals bucket whose decisions are
// audited with the approver as the acting actor.
func (c *Client) approvalStore() *approvalstore.Store {
	return approvalstore.NewStore(c.b.Approvals, auditemit.New(c.b.NC, auditemit.Options{Prefix: c.b.Names.Prefix(), Audit: c.b.Audit, Index: c.b.Index, Logger: c.cfg.Logger})).OnSkipped(func(key string, err error) {
		c.cfg.Logger.Warn("approval does not decode: skipped", "bucket", c.b.Names.ApprovalsBucket(), "key", key, "err", err)
	})
}

// Approval returns an approval. A principal's client (under access
// control) asks the workers, who show it the approvals it requested and,
// to an approver, those of its types (approvals.ErrNotFound for any other);
// an open server's client reads the approvals bucket.
func (c *Client) Approval(ctx context.Context, approvalID string) (*approvals.Record, error) {
	if c.principal != broker.Anonymous {
		return approvalsrpc.One(ctx, c.b.NC, c.b.Names, approvalID)
	}
	return c.approvalStore().Get(ctx, approvalID)
}

// ListApprovals asks the workers for a page of the approvals req selects:
// they show a principal the approvals it requested itself (an approver those
// of its types too), and an open server's clients every one. The page's Next
// is req.Cursor of the next one.
func (c *Client) ListApprovals(ctx context.Context, req approvals.ListRequest) (*approvals.ListReply, error) {
	return approvalsrpc.List(ctx, c.b.NC, c.b.Names, req)
}

// Decide approves or rejects a pending approval. A principal's client
// (under access control) sends the decision to the workers, who check that
// the principal may decide it and record it with the principal's actor (an
// approver's; v.Approver is not read). An open server's client decides as
// v.Approver, writing the approvals bucket and the decision's audit event
// itself. A refusal matches the store's conditions with errors.Is
// (approvals.ErrForbidden, approvals.ErrSelfApproval, ...).
func (c *Client) Decide(ctx context.Context, approvalID string, v approvals.Verdict) (*approvals.Record, error) {
	if c.principal != broker.Anonymous {
		return approvalsrpc.Decide(ctx, c.b.NC, c.b.Names, approvalsrpc.DecideRequest{ApprovalID: approvalID,
			Approve: v.Approve, Comment: v.Comment, SelfApproval: v.SelfApproval})
	}
	return c.approvalStore().Decide(ctx, approvalID, v)
}

// WithdrawApproval cancels a pending or approved approval before it is used;
// by is recorded as the decision's actor and the trail shows a rejection
// with status cancelled. A client whose connection may not write approvals
// gets approvals.ErrNoBucket.
func (c *Client) WithdrawApproval(ctx context.Context, approvalID string, by envelope.Actor, reason string) (*approvals.Record, error) {
	return c.approvalStore().Cancel(ctx, approvalID, by, reason)
}

// Trail reads an execution's audit trail, in order, as the client's
// principal may: its own executions' trails, or every one on an open server.
// A trail with no event fails with audit.ErrNoEvents.
func (c *Client) Trail(ctx context.Context, executionID string) ([]audit.Event, error) {
	return audit.Read(ctx, c.b.NC, c.b.Names.Prefix(), c.principal, executionID)
}

// ProveTrail returns an execution's trail with the proof that it is in the
// deployment's audit log, unchanged, against a signed checkpoint (and the
// envelope its terminal event commits to): check it with Verify and the
// deployment's public key. It waits, until ctx ends, for a checkpoint that
// covers the trail's last event (the checkpointer signs about every
// second), and, right after a call, for the terminal event the worker files
// just after the envelope. Like Trail, it needs a connection that may read the audit
// stream.
func (c *Client) ProveTrail(ctx context.Context, executionID string) (*audit.TrailProof, error) {
	return auditproof.Prove(ctx, c.b, c.principal, executionID, "")
}

// FollowTrail calls fn with every event of an execution's trail as it is
// filed, until ctx ends or fn returns an error (which it returns); opts say
// where to start (default: new events only, audit.FromStart for all).
func (c *Client) FollowTrail(ctx context.Context, executionID string, fn func(audit.Event) error, opts ...audit.FollowOption) error {
	return audit.Follow(ctx, c.b.NC, c.b.Names.Prefix(), audit.Filter{Principal: c.principal, ExecutionID: executionID}, fn, opts...)
}

// CatalogChanges signals on the returned channel each time workers change
// the catalog (a capability served, withdrawn or expired) or an operator
// pauses or unpauses calls (DESIGN §18): each time what Describe answers may
// have changed. It coalesces changes the reader has not taken yet; the
// channel is closed when ctx ends or the catalog's watch fails. Only a client
// of an open server may watch: a principal may create no consumer, and gets
// an error.
func (c *Client) CatalogChanges(ctx context.Context) (<-chan struct{}, error) {
	w, err := c.b.Catalog.WatchAll(ctx, jetstream.UpdatesOnly())
	if err != nil {
		return nil, err
	}
	ctx, stop := context.WithCancel(ctx)
	pw, err := pauses.Watch(ctx, c.b.JS, c.b.Names, c.cfg.Logger, nil)
	if err != nil {
		stop()
		_ = w.Stop()
		return nil, err
	}
	ch := make(chan struct{}, 1)
	signal := func() {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	go func() {
		defer close(ch)
		defer pw.Stop()
		defer stop()
		defer func() { _ = w.Stop() }()
		changed := pw.Changed()
		for {
			select {
			case <-ctx.Done():
				return
			case <-changed:
				changed = pw.Changed()
				signal()
			case _, ok := <-w.Updates():
				if !ok {
					return
				}
				signal()
			}
		}
	}()
	return ch, nil
}

// SubmitResume opens a new execution of an approved call and returns its id.
// The request carries the approval's id, its stored input, its requester as
// the actor and its surface, whatever opts say; opts may set the execution
// id, the correlation id (default: the original call's) and a deadline. The
// worker consumes the approval with one CAS: of every execution resuming
// one approval, exactly one runs; the others end APPROVAL_CONSUMED. An
// approval that is not approved ends the execution with the matching
// APPROVAL_* code, audited like any refusal. Like Submit, it publishes again
// under the execution id until the stream answers (a stream electing a
// leader), or ctx ends.
func (c *Client) SubmitResume(ctx context.Context, approvalID string, opts ...CallOption) (string, error) {
	if err := c.closed(); err != nil {
		return "", err
	}
	if c.b.Approvals == nil {
		return c.submitResumeByID(ctx, approvalID, opts)
	}
	rec, err := approvalstore.NewStore(c.b.Approvals, nil).Get(ctx, approvalID)
	if err != nil {
		return "", err
	}
	raw, err := rec.Raw()
	if err != nil {
		// Changed in the bucket into something that is not JSON: there is no
		// input to submit. Any other change is caught by the worker's re-hash.
		return "", fmt.Errorf("capstan: resume %s: %w: the stored input does not parse: %v", approvalID, approvals.ErrInputMismatch, err)
	}
	r, _, err := c.newRequest(rec.CapabilityID, raw, opts)
	if err != nil {
		return "", err
	}
	r.ApprovalID, r.Actor = rec.ID, rec.Actor
	if rec.Surface != "" {
		r.Surface = rec.Surface
	}
	if r.CorrelationID == "" {
		r.CorrelationID = rec.CorrelationID
	}
	end := c.cfg.Observer.Call(ctx, r)
	m, _, err := c.message(ctx, r)
	if err == nil {
		err = c.publish(ctx, m)
	}
	end(nil, err)
	if err != nil {
		return "", fmt.Errorf("capstan: resume %s: %w", approvalID, err)
	}
	return r.ExecutionID, nil
}

// Resume submits a resume (see SubmitResume) and awaits its envelope. err
// reports transport trouble, an unknown approval (approvals.ErrNotFound) and
// a stored input that is not even JSON (approvals.ErrInputMismatch); every
// governed outcome is in the envelope.
func (c *Client) Resume(ctx context.Context, approvalID string, opts ...CallOption) (*envelope.Envelope, error) {
	if progress := c.progressFor(ctx, 1); progress != nil {
		// Its progress is followed from before the request is published.
		id := envelope.NewExecutionID()
		if !ownID(opts) {
			var r envelope.Request
			for _, o := range opts {
				o(&r)
			}
			id = r.ExecutionID
		}
		opts = append(opts, WithID(id))
		progress.follow(id)
		defer progress.stop()
		if _, err := c.SubmitResume(ctx, approvalID, opts...); err != nil {
			return nil, err
		}
		return c.Await(context.WithValue(ctx, progressKey{}, nil), id)
	}
	id, err := c.SubmitResume(ctx, approvalID, opts...)
	if err != nil {
		return nil, err
	}
	return c.Await(ctx, id)
}

// submitResumeByID submits a resume naming only its approval, for a
// principal that may not read approvals: the workers take the capability,
// input, actor and surface from the approval, and refuse it unless this
// principal requested it.
func (c *Client) submitResumeByID(ctx context.Context, approvalID string, opts []CallOption) (string, error) {
	if err := envelope.ValidExecutionID(approvalID); err != nil {
		return "", fmt.Errorf("capstan: approval id: %w", err)
	}
	r := &envelope.Request{V: envelope.Version, ApprovalID: approvalID, SubmittedAt: time.Now().UTC()}
	startBy := c.defaultStartBy(r.SubmittedAt)
	r.StartBy = &startBy
	for _, o := range opts {
		o(r)
	}
	c.capStartBy(r)
	r.ApprovalID, r.CapabilityID = approvalID, ""
	if r.ExecutionID == "" {
		r.ExecutionID = envelope.NewExecutionID()
	}
	if err := envelope.ValidExecutionID(r.ExecutionID); err != nil {
		return "", fmt.Errorf("capstan: %w", err)
	}
	end := c.cfg.Observer.Call(ctx, r)
	b, err := envelope.Marshal(r)
	if err == nil {
		m := nats.NewMsg(c.b.Names.UnroutedSubject(c.principal))
		m.Data = b
		m.Header.Set(jetstream.MsgIDHeader, c.ids.Request(c.principal, r.ExecutionID))
		err = c.publish(ctx, m)
	}
	end(nil, err)
	if err != nil {
		return "", fmt.Errorf("capstan: resume %s: %w", approvalID, err)
	}
	return r.ExecutionID, nil
}
