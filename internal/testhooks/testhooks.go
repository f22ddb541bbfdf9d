// Package testhooks reaches what capstan's public API keeps from its users,
// for the module's own tests, benchmarks and the CLI's measuring flags: the
// resources a client opened, and worker options that trade a guarantee or
// the audit trail for a measurement. Package executor sets the hooks when
// it is initialized; nothing outside this module can import them.
package testhooks

import (
	"time"

	"github.com/capstan-dev/capstan/internal/broker"
)

// WorkerKnobs are the worker options no production worker sets.
type WorkerKnobs struct {
	// DisableLeaseRenewal stops lease renewal and InProgress, so JetStream
	// redelivers a long execution while it runs: for tests of redelivery.
	DisableLeaseRenewal bool
	// DisableAudit publishes no audit events (for measuring the trail's
	// cost).
	DisableAudit bool
	// AuditUnacknowledged publishes asynchronous audit events without
	// asking for JetStream's acknowledgement: one server message fewer per
	// execution, but an event the server refuses (a full audit stream that
	// discards new events) is then neither logged nor counted. Strict
	// audit's capability.started is acknowledged either way.
	AuditUnacknowledged bool
	// CatalogLag holds back each change the worker's catalog watcher
	// receives after the first load this long (at most until the worker
	// stops) before its copy of the catalog has it: for tests of a worker
	// whose copy lags the bucket.
	CatalogLag time.Duration
	// ControlClock is the time the worker's quotas of control requests and
	// its coalescing of read-only audit events read (nil: the clock): a test
	// that holds it still counts what a quota lets through without timing.
	ControlClock func() time.Time
	// Clock is the worker's clock (nil: the machine's): a test runs a
	// worker on a machine whose clock is off.
	Clock func() time.Time
	// BeforeAttempt is called once an execution's first attempt on the
	// worker has passed its pause gate and its limits, before its record
	// says it runs: a test holds an attempt there.
	BeforeAttempt func(executionID string, attempt int)
}

// Set by package executor's init.
var (
	// ClientBroker returns the resources an *executor.Client opened.
	ClientBroker func(client any) *broker.Broker
	// WorkerKnobsOf returns the knobs of an *executor.WorkerConfig.
	WorkerKnobsOf func(cfg any) *WorkerKnobs
)

// Broker returns the resources client (an *executor.Client) opened.
func Broker(client any) *broker.Broker { return ClientBroker(client) }

// Worker returns cfg (an executor.WorkerConfig) with its knobs set to k.
func Worker[C any](cfg C, k WorkerKnobs) C {
	*WorkerKnobsOf(&cfg) = k
	return cfg
}
