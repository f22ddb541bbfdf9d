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
)

// Approvals returns a store over the approvals bucket whose decisions are
// audited with the approver as the acting actor. It is cheap: take one where
// it is needed.
func (c *Client) Approvals() *approvals.Store {
	return approvals.NewStore(c.b, audit.NewEmitter(c.b, audit.Options{Logger: c.cfg.Logger})).OnSkipped(func(key string, err error) {
		c.cfg.Logger.Warn("approval does not decode: skipped", "bucket", c.b.Names.ApprovalsBucket(), "key", key, "err", err)
	})
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
	rec, err := approvals.NewStore(c.b, nil).Get(ctx, approvalID)
	if err != nil {
		return "", err
	}
	raw, err := rec.Raw()
	if err != nil {
		// Changed in the bucket into something that is not JSON: there is no
		// input to submit. Any other change is caught by the worker's re-hash.
		return "", fmt.Errorf("capstan: resume %s: %w: the stored input does not parse: %v", approvalID, approvals.ErrInputMismatch, err)
	}
	r, err := c.newRequest(rec.CapabilityID, raw, opts)
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
	m, err := c.message(r)
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
	c.defaultStartBy(r)
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
