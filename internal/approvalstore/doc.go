// Package approvalstore keeps the approval records (package approvals) in
// the deployment's approvals bucket: the workers create and consume them,
// approvers decide them, every change one compare-and-swap on the record's
// revision (DESIGN §7).
//
// A worker that meets a call needing approval stores a pending record
// holding the validated input as canonical JSON (Canonical) and its
// SHA-256, and finalizes the execution "approval-required". An approver
// decides it once: Decide moves it from pending with one compare-and-swap,
// refuses the requester approving their own call, and audits the decision
// with the approver as the actor. A resume is a new execution carrying the
// approval's id; its worker consumes the approval with one more
// compare-and-swap, from approved to consumed{executionId}. Because every
// change is a CAS on the record's revision in one JetStream KV bucket, an
// approval authorizes exactly one execution however many workers, clients
// and CLIs race to use it.
//
// An approval authorizes one execution for as long as it exists, and its own
// record is the proof of use: consumed, it names the execution and the
// execution record under which it was consumed, and it is usable again only
// by a delivery holding that same record (a takeover of the execution while
// it is in flight), never by another execution nor by the same id sent again
// after that record expired (approvals.ErrConsumed; see Usable).
//
// Code gives the error code an envelope carries for each of the approvals'
// conditions.
package approvalstore
