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
// A delivery is one pass: the facts it finds go to a pure rule (the
// takeover table, Takeover, or another), which returns an Action;
// delivery.apply carries the action out and returns the one that follows,
// until the delivery is settled. apply is the one place where an action is
// acted on: the table's, and the engine's own steps' (a run's end, an
// approval to ask for, a refusal, a wait for a limit). The steps are
// values out: the attempts, the receipts and the recovery return how they
// end; none calls the delivery back.
//
// One delivery reads top-down, and back up, through these files, in this
// order; calls between them go one way, down the list — no file calls
// back into one above it (shape_test.go holds this, and that no type has
// more than 25 methods):
//
//   - runner.go: the Runner, the worker's face; its intake (intake.go)
//     pulls every principal's queue, the queues taking turns for the slots
//     (turns.go), and hands each delivery to Runner.handle.
//   - delivery.go: the pass. arrive decides what a delivery means before
//     anything is read (a request to refuse, a redelivery of an execution in
//     flight here, or the table's first word: claim it, or end it
//     NOT_STARTED); pass applies actions until the delivery is settled. Each
//     step of apply is a method of the delivery there.
//   - recover.go: the receipts and reconcilers of DESIGN §5. A receipt is a
//     field of the Record, written by the claim's compare-and-swap (a lost
//     lease cannot write it), and a row of the takeover table ends a
//     takeover that finds it (Recover); asking a capability what happened
//     to an attempt that may have run is an action of the table
//     (Reconcile), carried out under the claim and its lease as an attempt
//     is, whose answer the table decides again (Facts.Reconciled).
//   - attempts.go: the run (Run, Retry): the capability's admission
//     (stages 4 to 9), its limits (limits.go), the attempts under the lease,
//     the retry rule, the output's checks (12, 13), the attempt's receipts.
//   - finalize.go: stage 14: the terminal audit event, the one create-only
//     envelope; the delivery then acknowledges.
//   - execution.go: the execution a delivery works on: its claim, lease
//     keeper and trail, and the facts it gathers for the table.
//   - takeover.go: the rules, pure functions of what a delivery found and
//     the time: the takeover table (Takeover), what a missing record proves
//     (AbsenceProves), the deadlines.
//   - claim.go: the claim on the execution's record, changed by
//     compare-and-swap only, and the lease keeper, whose lost lease ends
//     the handler's context.
//   - worker.go: what the deliveries of a worker share — its
//     configuration, clock and log, the store, the trail's emitter, the
//     table of executions in flight, the counters — and the settling of a
//     message (nak, ackSync).
//   - record.go: the record and the store it lives in, with the envelopes.
//
// cancel.go records a caller's cancel on the record, which the table and
// the lease keeper read. The sweeper (package sweeper) ends the requests no
// worker is given, through Runner.EndUnrun, EndRefused, EndUndecodable,
// RestoreEnvelope and EndTaken (sweep.go).
//
// Where what comes next fits: a rule is a case of a pure table and a row of
// its test; what the engine does about it is a step that returns an Action,
// and, if it is a new kind of action, a case of apply. A limit that makes a
// request wait is such an action (a Wait, or a refusal); what an attempt
// reports of its progress rides the lease keeper's renewal.
//
// Config.Observer (package observe) is told of each delivery from its start
// to its end: the claim, the stages that wait on I/O, each attempt, a
// retry, a takeover and the finalization; metrics and traces hang there,
// and the attempt's context, which the handler receives, is the one the
// observer returns. Config.Now is the engine's clock: every rule reads the
// time there.
package engine
