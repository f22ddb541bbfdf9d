// Package sweeper ends the requests no worker will take (DESIGN §13): a
// request for a capability no pool serves, whose pool is down, or stored on
// a subject no consumer's filter covers. A work-queue stream refuses a
// consumer that overlaps the pools' filters, so a pass reads the exec
// stream message by message (a stream "get next by subject", no consumer)
// and acts only on requests past their start deadline with no live lease
// on their record. What it does with each is its table (Decide, table.go),
// a pure function of the request's record, its envelope, what a missing
// record proves and the time:
//
//	no record, its envelope there                     -> remove the message
//	no record, which proves nothing started           -> failed / NOT_STARTED
//	no record, which proves nothing (AbsenceProves),
//	or claimed with WORKER_LOST (a claim made so)      -> failed / OUTCOME_UNKNOWN
//	claimed, lease expired (the handler never started) -> failed / NOT_STARTED
//	pending with a cancel                              -> cancelled / CANCELLED
//	running or backoff, past the TTL deadline          -> failed / OUTCOME_UNKNOWN
//	finalized without its envelope                     -> the envelope it stands for
//	anything else                                      -> nothing: a pool's worker decides
//
// The worker's engine writes what the table decides, as it does for a
// delivery: it claims a record by compare-and-swap before it writes the
// envelope, so a worker that takes the request meanwhile and the sweeper
// never both finalize; a pool's worker that later receives the request
// finds the envelope and acknowledges it. The sweeper then removes the
// message when its credentials allow it; otherwise JetStream drops it at the
// record TTL.
//
// One worker sweeps at a time: the duty is a lease in the pools bucket,
// taken and renewed by compare-and-swap every pass. A pass costs one stream
// read per queued request (eight ranges of the stream read at once), one
// consumer listing, and one record read per request past its deadline;
// then one watch of the limits' slots, and one record read per
// holder past its recorded lease, to free the slots of executions gone
// that no one asks for (DESIGN §17). None of it is on an execution's path.
package sweeper
