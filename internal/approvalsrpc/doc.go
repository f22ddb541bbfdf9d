// Package approvalsrpc is the workers' side of the approvals requests and
// the listing asked of them: a worker answers decisions (DecideHandler) and
// listings (ListHandler) on a principal's behalf, paging from its Index, a
// copy of the approvals bucket kept current by one watcher; List and One
// ask the workers for a page or one approval over a raw connection (what
// executor.Client.ListApprovals does for an application).
//
// The records, the requests and replies on the wire and the store's rules
// are package approvals'.
package approvalsrpc
