// Package engine is what a worker does with one delivery of an execution
// request: the machinery behind executor.Worker that keeps capstan's
// guarantees across redeliveries, lost workers and crashes (DESIGN §4, §5,
// §6, §13, §14).
//
// The public side hands the engine a Capability and gets decisions back
// (capability.go): the stages of a capability's definition return an
// Admission — a WorkUnit to run, a refusal, an approval needed — and the
// audit events they want filed; they never call back into the engine. The
// engine alone claims, writes records, files the trail and writes
// envelopes.
//
// One delivery reads top-down, and back up, through these files:
//
//   - runner.go: Runner.Serve pulls deliveries from the pool's consumer and
//     hands each to handle; it keeps the executions in flight here.
//   - handle.go: Runner.handle decides what the delivery means: a
//     redelivery of an execution this worker runs, one past its start
//     deadline, a capability rolling out, or one to claim
//     (Execution.claimAndRun). When a record is there, Execution.decide
//     carries out the takeover table's action.
//   - takeover.go: the rules, pure functions of what a delivery found and
//     the time: the takeover table (Takeover), what a missing record
//     proves (AbsenceProves), the deadlines.
//   - execution.go: an Execution and its run: the capability's admission
//     (stages 4 to 9), the attempts under the lease, the retry rule, the
//     output's checks (12, 13); its trail holds its audit events.
//   - claim.go: the claim on the execution's record, changed by
//     compare-and-swap only, and the lease keeper, whose lost lease ends
//     the handler's context. record.go: the record and the store it lives
//     in, with the envelopes.
//   - finalize.go: stage 14: the terminal audit event, the one create-only
//     envelope, then the acknowledgement; and the endings of requests no
//     delivery runs (refused before they could run, never started, swept).
//
// cancel.go records a caller's cancel on the record, which decide and the
// lease keeper read. The sweeper (package sweeper) ends the requests no
// worker is given, through Runner.EndUnrun, RestoreEnvelope and EndTaken.
//
// recover.go carries out the receipts and reconcilers of DESIGN §5: a
// receipt is a field of the Record, written by the claim's compare-and-swap
// (a lost lease cannot write it), and a row of the takeover table ends a
// takeover that finds it (Recover); asking a capability what happened to an
// attempt that may have run is an action of the table (Reconcile), carried
// out under the claim and its lease as an attempt is, whose answer the table
// decides again (Facts.Reconciled).
//
// Where what comes next fits: a limit that makes a request wait is an
// Admission the engine carries out (a delay, or a refusal); what an attempt
// reports of its progress rides the lease keeper's renewal. Each is a case of
// a table and a row of its test, and a field or a method of the seam.
//
// Config.Observer (package observe) is told of each delivery from its start
// to its end: the claim, the stages that wait on I/O, each attempt, a
// retry, a takeover and the finalization; metrics and traces hang there,
// and the attempt's context, which the handler receives, is the one the
// observer returns. Config.Now is the engine's clock: every rule reads the
// time there.
package engine
