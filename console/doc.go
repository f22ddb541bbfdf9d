// Package console is capstan's web console: a small web application, served
// by the binary itself, for the people around the agents — approvers deciding
// what waits for them, operators following what ran, what failed and why.
//
// Pages, each at a stable URL:
//
//   - / — the start page: what waits for you, what ran in the last hour,
//     what serves.
//   - /approvals — the inbox: pending approvals the signed-in principal may
//     decide (by approval type), with capability, requester, reasons, risk,
//     an expiry countdown and the input as the capability shows it to
//     approvers (executor.Meta.RedactApprovalInput); approve or reject with a
//     comment; a refused decision (self-approval, already decided, expired)
//     is shown with its code. It updates live when anyone decides.
//     /approvals/<approvalId> is one approval.
//   - /executions — a live list of the executions the principal may see,
//     newest first, paged, filtered by capability, status, actor, principal
//     and time: the workers' listing (capstan.executions.list), as the CLI's.
//   - /executions/<executionId> — one execution: envelope, record state,
//     attempts, and its audit trail as a timeline in which retries,
//     takeovers, approvals and the outcome stand out; while it runs, how
//     far its handler has got (executor.Call.Progress), live for a session
//     that may receive its progress (its owner, an admin); cancel for its
//     owner or an admin.
//   - /capabilities — the catalog per pool, the workers seen serving each
//     capability, and each pool's queue depth.
//
// Every read and action goes through the signed-in session's own NATS
// connection, opened with the principal's credentials (a .creds file or a
// bearer user token), so the server's permissions apply to the console as
// they do to the CLI; nothing is readable before sign-in. Decisions are
// requests the workers serve (capstan.approvals.decide of the principal, as
// capstan approve sends them): the approver is the principal the server
// authenticated, and its grant's types apply.
// Executions are read through the workers too (capstan.executions.list and
// .get of the principal), who answer each role with what it may see: an
// admin everything, a producer its own executions, their trails and
// results, an approver the executions behind the approvals it may decide,
// with the input as approvers are shown it. Pages fit a phone's 390 px, in
// light and dark. In open mode (Config.Open, for `capstan
// dev` on loopback) sign-in only names the approver and sessions share one
// connection.
//
// A request must name the console by one of its hosts (Config.AllowedHosts;
// on loopback also localhost and loopback addresses), or it is refused with
// 421, so that a page of a site whose DNS name is turned into the console's
// address cannot use it; forms posted by pages of other sites are refused.
//
// Assets are embedded: plain HTML rendered on the server, one stylesheet and
// one small script for live updates (server-sent events) and countdowns.
// Every page works without the script.
//
//	c, err := console.New(console.Config{Open: true, Conn: nc})
//	if err != nil { ... }
//	l, err := net.Listen("tcp", "127.0.0.1:8233")
//	if err != nil { ... }
//	err = c.Serve(ctx, l) // until ctx ends
package console
