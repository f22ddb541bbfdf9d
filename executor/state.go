package executor

import "github.com/capstan-dev/capstan/executor/internal/engine"

// State is an execution record's state (DESIGN §5).
type State = engine.State

// Record states.
const (
	// StatePending: a cancel arrived before any worker claimed the execution.
	StatePending   = engine.StatePending
	StateClaimed   = engine.StateClaimed
	StateRunning   = engine.StateRunning
	StateBackoff   = engine.StateBackoff
	StateFinalized = engine.StateFinalized
	// StateReconciling: a takeover asks the capability's reconciler whether
	// a lost attempt took effect (DESIGN §5).
	StateReconciling = engine.StateReconciling
)

// Record is an execution's one record in the executions bucket, changed only
// by compare-and-swap on its revision. The worker named in it owns the
// execution while its lease lasts.
type Record = engine.Record
