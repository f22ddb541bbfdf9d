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
// refusal matches the store's conditions with errors.Is (approvals.ErrNotFound,
// approvals.ErrForbidden, envelope.ErrQuotaExceeded).
func List(ctx context.Context, nc *nats.Conn, n broker.Names, req approvals.ListRequest) (*approvals.ListReply, error) {
	req.V = envelope.Version
	b, err := envelope.Marshal(&req)
	if err != nil {
		return nil, err
	}
	m, err := nc.RequestWithContext(ctx, n.ListApprovalsSubject(broker.PrincipalOf(nc, n)), b)
	if err != nil {
		return nil, fmt.Errorf("capstan: list approvals: %w", err)
	}
	var reply approvals.ListReply
	if err := envelope.Unmarshal(m.Data, &reply); err != nil {
		return nil, fmt.Errorf("capstan: list approvals: reply: %w", err)
	}
	if err := reply.Err(); err != nil {
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
