// Package approvals keeps capstan's approvals: the human decisions a call
// waits for before its handler may run.
//
// A worker that meets a call needing approval stores a pending Record holding
// the validated input as canonical JSON and its SHA-256, and finalizes the
// execution "approval-required". An approver decides it once: Decide moves it
// from pending with one compare-and-swap, refuses the requester approving
// their own call, and audits the decision with the approver as the actor. A
// resume is a new execution carrying the approval's id; its worker consumes
// the approval with one more compare-and-swap, from approved to
// consumed{executionId}. Because every change is a CAS on the record's revision
// in one JetStream KV bucket, an approval authorizes exactly one execution
// however many workers, clients and CLIs race to use it.
//
// The smallest useful program decides and consumes one approval:
//
//	kv, err := js.KeyValue(ctx, "CAPSTAN_APPROVALS") // the bucket workers provision
//	store := approvals.NewStore(kv, audit.NewEmitter(nc, audit.Options{}))
//	input, hash, err := approvals.Canonical(envelope.MustRaw(map[string]any{"orderId": "o1", "amount": 900}))
//	if err != nil { ... } // ErrUnserializableInput: NaN, byte strings, ...
//	rec := &approvals.Record{
//		ID: envelope.NewExecutionID(), CapabilityID: "orders.refund", RequestedBy: executionID,
//		Actor: alice, Input: input, InputHash: hash,
//	}
//	err = store.Create(ctx, rec) // pending, expiring in 15 minutes
//	_, err = store.Decide(ctx, rec.ID, approvals.Verdict{Approve: true, Approver: bob})
//	_, err = store.Consume(ctx, rec.ID, resumeExecutionID, record.CreatedAt) // once, for ever
//
// An approval authorizes one execution for as long as it exists, and its own
// record is the proof of use: consumed, it names the execution and the
// execution record under which it was consumed, and it is usable again only by
// a delivery holding that same record (a takeover of the execution while it
// is in flight), never by another execution nor by the same id sent again
// after that record expired (ErrConsumed).
//
// Errors are sentinels (ErrConsumed, ErrSelfApproval, ...); Code gives the
// error code an envelope carries for each.
//
// With the executor, workers create and consume the records themselves: an
// application decides through executor.Client.Decide and runs the approved
// call with executor.Client.Resume.
package approvals
