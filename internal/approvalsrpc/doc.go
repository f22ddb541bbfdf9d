// Package approvalsrpc is the approvals requests the workers answer, both
// sides: a worker answers decisions (DecideHandler) and listings
// (ListHandler) on a principal's behalf, paging from its Index, a copy of
// the approvals bucket kept current by one watcher; Decide, List and One
// send them over a raw connection (what executor.Client.Decide and
// ListApprovals, capstan approve and the console do). DecideRequest and
// DecideReply are a decision's bodies on the wire; a listing's are
// approvals.ListRequest and ListReply.
//
// The records and their conditions are package approvals'; the store and
// its rules, package approvalstore's.
package approvalsrpc
