package executor_test

import (
	"context"
	"fmt"
	"time"

	"github.com/capstan-dev/capstan/executor"
)

// A request carries a start deadline (24 h unless the client or the call says
// otherwise). Here the pool that serves reports.build is down: its request
// waits for it, and when no worker has started it by the deadline, the worker
// holding the sweeping duty ends it NOT_STARTED. The model is told it never
// ran.
func ExampleStartWithin() {
	nc, cleanup := exampleConn()
	defer cleanup()
	ctx := context.Background()

	report := slowReport(executor.Meta{
		Description: "Builds the monthly sales report.",
		Expose:      executor.On(executor.SurfaceDirect),
		SideEffect:  executor.SideEffectRead,
	}, nil)
	// The reports pool served it once, and is down now.
	stopReports := exampleWorker(nc, executor.WorkerConfig{Pool: "reports", SweepInterval: -1}, report)
	stopReports()
	// Another pool runs, and sweeps often for the example's sake.
	stop := exampleWorker(nc, executor.WorkerConfig{SweepInterval: 20 * time.Millisecond}, echoCap(nil))
	defer stop()
	c := exampleClient(nc)
	defer c.Close()

	env, err := c.Call(ctx, "reports.build", Report{Month: "2026-01"}, executor.As(exampleAlice),
		executor.StartWithin(100*time.Millisecond))
	check(err)
	m := env.ForModel()
	fmt.Println(env.Status, m.Code, "retryable:", m.Retryable)
	fmt.Println(m.Message)
	// Output:
	// failed NOT_STARTED retryable: false
	// No worker started the operation before its start deadline; it never ran.
}
