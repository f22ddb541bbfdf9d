package sweeper

import (
	"time"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor/internal/engine"
)

// The sweeper's table of DESIGN §13, as one pure function: what a pass does
// with one stored request, given its record and envelope, what a missing
// record proves of it, its deadlines and the time. Every row is one case
// below and one row of TestDecide (table_test.go).

// Facts is what the sweeper decides from.
type Facts struct {
	// Record is the request's execution record, nil when there is none.
	Record *engine.Record
	// Envelope is what a read of its envelope found (read only when there
	// is no record).
	Envelope engine.EnvelopeRead
	// AbsenceProves: finding no record proves that no attempt started
	// (engine.AbsenceProves, no consumer having delivered the request
	// counting as its first delivery).
	AbsenceProves bool
	// StartDeadline and TTLDeadline are the request's (DESIGN §13).
	StartDeadline, TTLDeadline time.Time
	// Now is the time of the decision.
	Now time.Time
}

// Do is what the sweeper does with one request.
type Do int

// The sweeper's actions.
const (
	// Leave it: not due, held by a live lease, or a pool's worker decides.
	Leave Do = iota
	// Remove the message: the request has its envelope.
	Remove
	// EndUnrun ends a request without a record with Err (NOT_STARTED, or
	// OUTCOME_UNKNOWN where the missing record proves nothing): a finalized
	// record, the trail, the envelope (engine.Runner.EndUnrun).
	EndUnrun
	// Restore writes the envelope a finalized record stands for.
	Restore
	// End takes the record over by compare-and-swap and ends it with Err,
	// reporting Attempts (engine.Runner.EndTaken).
	End
)

// Action is one decision of the sweeper's table.
type Action struct {
	Do Do
	// Err is what EndUnrun and End end the request with.
	Err *envelope.CapabilityError
	// Attempts is what End reports: the attempts the record counts.
	Attempts int
}

// Due reports whether the request is past its start deadline: before it,
// a pool's worker may still start it, and the sweeper reads nothing more.
func Due(f Facts) bool { return f.Now.After(f.StartDeadline) }

// Decide is the sweeper's table of DESIGN §13.
func Decide(f Facts) Action {
	if !Due(f) {
		return Action{Do: Leave}
	}
	rec := f.Record
	if rec == nil {
		switch f.Envelope {
		case engine.EnvelopePresent:
			// Ended already (this is a copy, or its ack was lost).
			return Action{Do: Remove}
		case engine.EnvelopeAbsent:
		default:
			return Action{Do: Leave} // not known
		}
		if !f.AbsenceProves {
			// An attempt may have run under a record that has expired
			// since: never "it never ran".
			return Action{Do: EndUnrun, Err: engine.ExpiredRecordError()}
		}
		return Action{Do: EndUnrun, Err: engine.NotStartedError()}
	}
	switch {
	case rec.State == engine.StateFinalized:
		return Action{Do: Restore}
	case rec.Leased(f.Now):
		return Action{Do: Leave}
	case rec.CancelRequested:
		return Action{Do: End, Err: engine.CancelledError(), Attempts: rec.Attempt}
	case rec.State == engine.StateClaimed && rec.LastError == envelope.CodeWorkerLost:
		// Claimed where no record proved that no attempt had run.
		return Action{Do: End, Err: engine.ExpiredRecordError(), Attempts: rec.Attempt}
	case rec.State == engine.StatePending || rec.State == engine.StateClaimed:
		return Action{Do: End, Err: engine.NotStartedError(), Attempts: rec.Attempt}
	case f.Now.After(f.TTLDeadline):
		// Started, and its worker lost: nothing may try it again.
		return Action{Do: End, Err: engine.LostWorkerError(), Attempts: rec.Attempt}
	}
	return Action{Do: Leave} // a pool's worker takes it over
}
