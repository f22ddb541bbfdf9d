package executor

import "github.com/capstan-dev/capstan/internal/delivery"

// State is an execution record's state (DESIGN §5).
type State = delivery.State

// Record states.
const (
	// StatePending: a cancel arrived before any worker claimed the execution.
	StatePending   = delivery.StatePending
	StateClaimed   = delivery.StateClaimed
	StateRunning   = delivery.StateRunning
	StateBackoff   = delivery.StateBackoff
	StateFinalized = delivery.StateFinalized
)

// Record is an execution's one record in the executions bucket, changed only
// by compare-and-swap on its revision. The worker named in it owns the
// execution while its lease lasts.
type Record = delivery.Record
