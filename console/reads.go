package console

import (
	"context"

	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/nats-io/nats.go"
)

// execReader reads executions as the signed-in principal may see them, the
// way the CLI does: through the workers (capstan.executions.list and .get of
// the principal), who answer an admin with every execution, a producer with
// its own and an approver with those behind the approvals it may decide.
// The console keeps no reading of its own: what it shows is what the
// workers' listing says.
type execReader struct {
	nc        *nats.Conn
	names     broker.Names
	principal string
}

// list is one page of executions.
func (r *execReader) list(ctx context.Context, req executor.ExecutionsRequest) (*executor.ExecutionsPage, error) {
	return executor.RequestExecutions(ctx, r.nc, r.names, req)
}

// get is one execution: its record, envelope, trail and the approvals
// behind it. owner names whose it is, for an admin; "" lets its trail say.
func (r *execReader) get(ctx context.Context, id, owner string) (*executor.ExecutionView, error) {
	return executor.RequestExecution(ctx, r.nc, r.names, executor.ExecutionRequest{ExecutionID: id, Owner: owner})
}
