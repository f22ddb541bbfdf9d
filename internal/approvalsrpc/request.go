package approvalsrpc

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/broker"
)

// List asks the workers for a page of the approvals the connection's
// principal may see (see PageAs): Next is the cursor of the next one. A
// refusal matches the approvals' conditions with errors.Is
// (approvals.ErrNotFound, approvals.ErrForbidden, envelope.ErrQuotaExceeded).
func List(ctx context.Context, nc *nats.Conn, n broker.Names, req approvals.ListRequest) (*approvals.ListReply, error) {
	req.V = envelope.Version
	var reply approvals.ListReply
	if err := request(ctx, nc, n.ListApprovalsSubject(broker.PrincipalOf(nc, n)), "list approvals", &req, &reply); err != nil {
		return nil, err
	}
	if err := ListErr(&reply); err != nil {
		return nil, err
	}
	if reply.Records == nil {
		reply.Records = []*approvals.Record{}
	}
	return &reply, nil
}

// One returns the approval id names, among those the connection's
// principal may see: one request, answered with the record or a refusal
// (approvals.ErrNotFound, approvals.ErrForbidden).
func One(ctx context.Context, nc *nats.Conn, n broker.Names, id string) (*approvals.Record, error) {
	page, err := List(ctx, nc, n, approvals.ListRequest{ID: id})
	if err != nil {
		return nil, err
	}
	for _, r := range page.Records {
		if r.ID == id {
			return r, nil
		}
	}
	return nil, fmt.Errorf("%w: %s", approvals.ErrNotFound, id)
}

// Decide sends req to the workers of the deployment n names as the
// connection's principal, the approver, and returns the decided record: how
// executor.Client.Decide, capstan approve and the console decide. A refusal
// is an error that errors.Is matches against the approvals' conditions
// (approvals.ErrSelfApproval, approvals.ErrForbidden,
// approvals.ErrAlreadyDecided...). A decision whose audit event is missing
// returns the record and an error matching audit.ErrUnavailable.
func Decide(ctx context.Context, nc *nats.Conn, n broker.Names, req DecideRequest) (*approvals.Record, error) {
	req.V = envelope.Version
	var reply DecideReply
	if err := request(ctx, nc, n.DecideSubject(broker.PrincipalOf(nc, n)), "decide "+req.ApprovalID, &req, &reply); err != nil {
		return nil, err
	}
	if reply.Error == "" {
		return reply.Record, nil
	}
	return reply.Record, conditions.Error(reply.Error, reply.Conditions, reply.Details)
}

// request sends req to subject and decodes the workers' answer into reply;
// what names the request in errors.
func request(ctx context.Context, nc *nats.Conn, subject, what string, req, reply any) error {
	b, err := envelope.Marshal(req)
	if err != nil {
		return err
	}
	m, err := nc.RequestWithContext(ctx, subject, b)
	if err != nil {
		return fmt.Errorf("capstan: %s: %w", what, err)
	}
	if err := envelope.Unmarshal(m.Data, reply); err != nil {
		return fmt.Errorf("capstan: %s: reply: %w", what, err)
	}
	return nil
}
