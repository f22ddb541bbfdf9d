// Package chaos holds capstan's crash tests: real processes, killed with
// SIGKILL, and the effects they left counted in a store that outlives them.
//
// The tests start one `capstan server` and several `capstan worker` child
// processes, submit demo executions, kill workers (aiming at those running
// an execution) or the server while handlers are in flight, and then check the
// promise of the takeover rules from what the store kept: one envelope per
// execution, a finalized record, at most one handler call per attempt (the
// demo appends one message per call to its calls stream, before the effect,
// without deduplication across calls), kills that hit attempts in flight, and
// what `capstan status` prints. email.send records a receipt once sent and
// reconciles against the outbox (DESIGN §5): a run fails when more than 1% of
// its executions end OUTCOME_UNKNOWN, when an attempt after the first ran
// without a reconciler's proof that the one before took no effect, or when
// any handler call came after the execution's email was sent (a duplicate
// send, even where the outbox, keyed on the idempotency key, folded it into
// the first). TestChaos_LyingReconciler_SeenAsDuplicateSends proves that a
// reconciler lying "absent" is caught so.
// Two cases hold DESIGN §13 under kills: workers that share one --id, with
// every other request stored twice, and a pool whose only worker is killed
// for good, whose requests must all end NOT_STARTED without running, ended by
// the sweeping workers of another pool while those are killed in turn.
//
// TestMain builds the capstan binary, with the race detector when the tests
// run with it; a race reported by any child process fails the test.
// CAPSTAN_CHAOS_BIN=path runs another capstan binary instead, and
// CAPSTAN_CHAOS_BIN=self the test binary itself in the part
// CAPSTAN_CHAOS_ROLE names (server or worker). Every run logs its seed;
// CAPSTAN_CHAOS_SEED=N replays its choice of victims and the kills' timing
// (the processes' scheduling is the machine's).
//
// By default the tests run a short mode fit for CI. CAPSTAN_CHAOS_LONG=1 runs
// the long mode: 1,000 executions per run under at least 20 seconds of kills,
// and 2,000 across a server kill.
//
//	go test -race ./cmd/capstan/internal/chaos/
//	CAPSTAN_CHAOS_LONG=1 go test -v -timeout 30m ./cmd/capstan/internal/chaos/
//	CAPSTAN_CHAOS_SEED=42 go test -v -run ServerKilled ./cmd/capstan/internal/chaos/
package chaos
