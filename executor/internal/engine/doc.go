// Package delivery is what a worker does with one delivery of an execution
// request: the machinery behind executor.Worker that keeps capstan's
// guarantees across redeliveries, lost workers and crashes.
//
// One delivery reads top-down through four files:
//
//   - runner.go: Runner.Serve pulls deliveries from the pool's consumer and
//     hands each to handle.
//   - handle.go: handle decides what the delivery means (DESIGN §5): a
//     redelivery of an execution this worker runs, a capability rolling out,
//     or one to claim. claimAndRun creates the execution's record (the claim);
//     when a record exists, decide applies the takeover table.
//   - pipeline.go: run drives the pipeline of DESIGN §4: the capability's
//     admission (stages 4 to 9), the attempts under the lease that
//     execution.go keeps, the retry rule, the output's checks (12, 13).
//   - finalize.go: finalize is stage 14: the terminal audit event, the one
//     create-only envelope, the record, then the acknowledgement.
//
// execution.go holds the execution's record and its compare-and-swap (owned
// by the claim's random token), and the lease, whose loss ends the handler's
// context; cancel.go records a caller's cancel on the record, which decide
// and the lease keeper read.
//
// Every request ends (DESIGN §13): deadline.go is the start deadline a
// delivery is compared with, and sweep.go the sweeper, a duty one worker holds
// at a time, which ends the requests no worker is given.
//
// capability.go is the seam with the public executor package, which gives
// each request its Capability: the stages a capability's definition decides
// (exposure, input, actor, policies, approval, the retry rule, output checks),
// run through Execution's exported methods. Everything that touches the
// execution's record, lease and envelope is here.
//
// Config.Observer (package observe) is told of each delivery from its start
// to its end: the claim, the stages that wait on I/O (Execution.Stage), each
// attempt, a retry, a takeover and the finalization; metrics and traces hang
// there, and the attempt's context, which the handler receives, is the one
// the observer returns.
package engine
