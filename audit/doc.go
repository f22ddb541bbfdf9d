// Package audit is capstan's durable trail: every execution's events, in
// pipeline order, on one JetStream stream, as msgpack records that never carry
// an input or an output, only their hash. An execution's events are on one of
// 1,024 subjects, capstan.audit.<shard> (broker.AuditShard: FNV-1a-32 of the
// execution id mod 1,024), with the execution's id in the Capstan-Execution-Id
// header of each message, so that the server's index does not grow with the
// history. A message holds one event, or several events of one execution
// (a worker writes a quick execution's events as one), stored whole or not at
// all; Decode reads both.
//
// A runtime retry and a model calling the tool again look different here: a
// retry is a capability.retried event inside one execution id; a re-invocation
// is a new execution id with its own capability.requested.
//
// Workers emit asynchronously by default: an event JetStream refuses is logged
// and counted (capstan_audit_publish_failures_total), and the execution goes
// on. With strict mode (executor.WorkerConfig.StrictAudit) capability.started
// must be stored before the handler runs, or the execution fails
// AUDIT_UNAVAILABLE.
//
// Reading needs nothing but the stream: Read (a Client's Trail) returns one
// execution's trail with direct gets of its shard from the time in its UUIDv7
// id, without a consumer; Follow (a Client's FollowTrail) tails the live
// stream with filters. Asynchronous events
// may still be on their way when the envelope arrives, so a trail read at that
// moment can lack its last events; a worker stores all of its events before
// Run returns.
//
//	trail, err := client.Trail(ctx, executionID) // oldest first; or audit.Read(ctx, nc, "", principal, executionID)
//	if err != nil { ... }
//	for _, ev := range trail {
//		fmt.Println(ev.Timestamp, ev.Type, ev.Data)
//	}
//	err = audit.Follow(ctx, nc, "", audit.Filter{Type: audit.EventDenied}, func(ev audit.Event) error {
//		fmt.Println(ev.ExecutionID, ev.CapabilityID, ev.Data["reason"])
//		return nil
//	})
//
// The stream keeps events for executor.Deployment.AuditMaxAge (default 30
// days).
//
// The trail is also a transparency log (DESIGN §8, "The trail as a log"):
// where the deployment runs a checkpointer (capstan server with its audit
// key), every stored message is a leaf of an RFC 6962 tree whose signed
// checkpoints anyone can check. A Client's ProveTrail returns an execution's
// trail with the proof that each of its messages is in the latest checkpoint, and its
// envelope, whose hash the terminal event commits to; Verify checks it with
// the deployment's public key alone:
//
//	p, err := client.ProveTrail(ctx, executionID)
//	if err != nil { ... }
//	err = p.Verify(publicKeys) // the deployment's audit.pub
package audit
