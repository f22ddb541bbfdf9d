// Package control is how a worker serves the control requests (describe,
// cancel, approvals' decisions and listings, executions' listings, readings
// and probes: DESIGN §3) so that one principal's flood costs that principal
// alone (DESIGN §12 "Quotas"):
//
//   - Rates refuses a principal's request beyond its controlPerSecond quota
//     at once, before anything of it is read or decoded: a token bucket per
//     principal, of one second's worth.
//   - Gate runs the admitted requests on a few goroutines that take turns
//     between principals, and lets no principal hold more than its share of
//     them, so that a principal's slow listings delay its own.
//
// Both are this worker's: a deployment of n workers lets a principal make n
// times its quota, which needs no server round trip per request.
package control
