// Package chaos holds capstan's crash tests: real processes, killed with
// SIGKILL, and the effects they left counted in a store that outlives them.
//
// The test binary plays every part: run with CAPSTAN_CHAOS_ROLE=server it is
// an embedded JetStream server on a store directory, with
// CAPSTAN_CHAOS_ROLE=worker a worker serving the demo catalog. The tests start
// one server and several workers as child processes, submit demo executions,
// kill workers (or the server) while they run, and then check the promise of
// the takeover rules: at most one envelope per execution, and never a second
// attempt of non-idempotent work.
//
// CAPSTAN_CHAOS_BIN=path runs a capstan binary instead (`capstan server`,
// `capstan worker`), and checks `capstan status` as well.
//
// By default the tests run a short mode fit for CI. CAPSTAN_CHAOS_LONG=1 runs
// the long mode: 1,000 executions per run under at least 20 seconds of kills,
// and 2,000 across a server kill.
//
//	go test -race ./internal/chaos/
//	CAPSTAN_CHAOS_LONG=1 go test -v -timeout 30m ./internal/chaos/
//	go build -o capstan ./cmd/capstan
//	CAPSTAN_CHAOS_BIN=$PWD/capstan CAPSTAN_CHAOS_LONG=1 go test -v ./internal/chaos/
package chaos
