package console

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/capstan-dev/capstan/execution"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/broker"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/nats-io/nats.go"
)

// execReader reads executions as the signed-in principal may see them, the
// way the CLI does: through the workers (capstan.executions.list and .get of
// the principal), who answer an admin with every execution, a producer with
// its own and an approver with those behind the approvals it may decide. A
// connection that may read the streams itself (an admin's, an open
// server's) reads them when no worker answers.
type execReader struct {
	nc        *nats.Conn
	names     broker.Names
	principal string
	b         *broker.Broker // nil unless the principal may read every stream
}

// list is one page of executions.
func (r *execReader) list(ctx context.Context, req executor.ExecutionsRequest) (*executor.ExecutionsPage, error) {
	page, err := executor.RequestExecutions(ctx, r.nc, r.names, req)
	if !errors.Is(err, executor.ErrNoWorkers) || r.b == nil || r.b.Index == nil {
		return page, err
	}
	q := req.Query
	if req.Cursor != "" {
		if err := q.SetCursor(req.Cursor); err != nil {
			return nil, err
		}
	}
	p, lerr := audit.List(ctx, r.b, q)
	if lerr != nil {
		return nil, lerr
	}
	out := &executor.ExecutionsPage{V: envelope.Version, Entries: p.Entries, Scanned: p.Scanned, Scope: executor.ScopeAll}
	out.Next = p.Cursor()
	return out, nil
}

// get is one execution: its record, envelope, trail and the approvals
// behind it. owner names whose it is, for an admin; "" lets its trail say.
func (r *execReader) get(ctx context.Context, id, owner string) (*executor.ExecutionView, error) {
	v, err := executor.RequestExecution(ctx, r.nc, r.names, executor.ExecutionRequest{ExecutionID: id, Owner: owner})
	if !errors.Is(err, executor.ErrNoWorkers) || r.b == nil {
		return v, err
	}
	return localView(ctx, r.b, id, owner)
}

// localView reads one execution from the streams and buckets, for a
// connection that may read them all, as the workers would show it to an
// admin.
func localView(ctx context.Context, b *broker.Broker, id, owner string) (*executor.ExecutionView, error) {
	v := &executor.ExecutionView{V: envelope.Version, ExecutionID: id, Scope: executor.ScopeAll}
	if owner == "" {
		// Ids are unique per principal: the one with an execution of it.
		owners, err := broker.Owners(ctx, b, id)
		if err != nil {
			return nil, err
		}
		switch len(owners) {
		case 0:
			owner = broker.PrincipalOf(b.NC, b.Names)
		case 1:
			owner = owners[0]
		default:
			return nil, fmt.Errorf("execution %s exists for several principals (%v): name one as its owner", id, owners)
		}
	}
	v.Principal = owner
	trail, err := audit.Read(ctx, b, owner, id)
	if err != nil && !errors.Is(err, broker.ErrNotFound) {
		return nil, err
	}
	v.Trail = trail
	key := broker.Key(owner, id)
	if rec, _, err := broker.Load[execution.Record](ctx, b.Executions, key); err == nil {
		v.Record = rec
	} else if !errors.Is(err, broker.ErrNotFound) {
		return nil, err
	}
	if env, _, err := broker.Load[envelope.Envelope](ctx, b.Envelopes, key); err == nil {
		v.Envelope = env
	} else if !errors.Is(err, broker.ErrNotFound) {
		return nil, err
	}
	var ids []string
	for _, ev := range trail {
		if s, ok := ev.Data["approvalId"].(string); ok && s != "" && !slices.Contains(ids, s) {
			ids = append(ids, s)
		}
	}
	store := approvals.NewStore(b, nil)
	for _, aid := range ids {
		if rec, err := store.Get(ctx, aid); err == nil && (rec.RequestedBy == id || rec.ConsumedBy == id) {
			v.Approvals = append(v.Approvals, rec)
		}
	}
	switch {
	case v.Envelope != nil:
		v.State = executor.ExecEnded
	case v.Record != nil || len(trail) > 0:
		v.State = executor.ExecInFlight
	default:
		return nil, fmt.Errorf("%w: %s", executor.ErrNoSuchExecution, id)
	}
	return v, nil
}
