// Package await is how an executor.Client waits for envelopes and rides out
// a failover of the servers.
//
// A client holds one subscription to every republished envelope (Waiters),
// never a JetStream consumer per call. Notifications are core NATS messages,
// so one can be missed: while the connection reconnects, or when a stream
// leader is lost between storing an envelope and republishing it. Waiters
// notices both and re-reads what it waits for. Publish stores a request
// through a leader election: it publishes again under the same message id,
// which the stream's deduplication makes safe. A fan-out sends every request
// at once (Send), then settles their acknowledgements, publishing again what
// failed or stayed unanswered (Settle), then waits for each envelope (Wait).
package await
