// Package pauses keeps the operators' emergency stops (DESIGN §18): a pause
// of a capability, a principal, an actor, any mix of them, or everything.
//
// A pause is one key of the pauses bucket, which admins write (Apply, Lift)
// and every worker watches (Watch): a worker reads its watched copy (Set)
// before every attempt starts, so that a deployment with no pause pays a
// nil pointer's load and nothing else. A pause either holds the calls it
// matches in their queue, where they keep their start deadline, or refuses
// them at once with the code PAUSED and the operator's reason.
//
// Every pause and every lift is an audit event, written and acknowledged
// before the bucket changes: nothing takes effect that the trail does not
// hold first. An operator's command then asks every worker to confirm that
// it has applied the change (Confirm), and each answers once its watched
// copy has it, with the running attempts it cancelled when the pause asked
// for that.
package pauses
