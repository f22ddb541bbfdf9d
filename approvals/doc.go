// Package approvals holds capstan's approvals as a program reads and decides
// them: the human decisions a call waits for before its handler may run.
//
// A worker that meets a call needing approval stores a pending Record
// holding the validated input as canonical JSON and its SHA-256, and ends
// the execution "approval-required". An approver decides it once, through
// executor.Client.Decide (or capstan approve) with a Verdict: the workers
// check that the approver may, refuse the requester approving their own
// call (ErrSelfApproval), and audit the decision with the approver as the
// actor. executor.Client.Resume then runs the approved call as a new
// execution carrying the approval's id, whose worker consumes the approval:
// every change is one compare-and-swap on the record in one JetStream KV
// bucket, so an approval authorizes exactly one execution however many
// workers, clients and CLIs race to use it.
//
//	env, err := alice.Call(ctx, "orders.refund", refund) // env.Status: approval-required
//	page, err := carol.ListApprovals(ctx, approvals.ListRequest{Status: approvals.StatusPending})
//	rec, err := carol.Decide(ctx, env.Approval.ID, approvals.Verdict{Approve: true, Comment: "checked"})
//	env, err = alice.Resume(ctx, env.Approval.ID) // runs once; a second resume ends APPROVAL_CONSUMED
//
// An approval authorizes one execution for as long as it exists, and its own
// record is the proof of use: consumed, it names the execution and the
// execution record under which it was consumed, and it is usable again only
// by a delivery holding that same record (a takeover of the execution while
// it is in flight), never by another execution nor by the same id sent again
// after that record expired (ErrConsumed).
//
// Errors are sentinels (ErrConsumed, ErrSelfApproval, ...) that errors.Is
// matches on what the Client's approval methods return; an execution
// refused for one ends with the matching code (APPROVAL_CONSUMED, ...).
package approvals
