// Package execution holds the execution record: the one entry per execution
// that workers keep in the executions bucket (DESIGN §5), read by clients,
// the console and operators' tools to tell where an execution is.
//
// A record is changed only by compare-and-swap on its revision; the claim it
// names owns the execution while its lease lasts. Its State moves from
// claimed (or pending, when a cancel came first) through running and backoff
// to finalized, after which the envelope holds the outcome:
//
//	st, err := client.Status(ctx, executionID)
//	if err == nil && st.Record != nil && st.Record.State == execution.StateRunning {
//		fmt.Println("attempt", st.Record.Attempt, "on", st.Record.Worker)
//	}
package execution
