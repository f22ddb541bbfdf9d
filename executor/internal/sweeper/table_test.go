package sweeper

import (
	"testing"
	"time"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor/internal/engine"
)

// TestDecide is the sweeper's table of DESIGN §13, row by row: what a pass
// does with a request past its start deadline, from its record (none, each
// state, a live or an expired lease, a cancel), its envelope, what a missing
// record proves and the TTL deadline; and that it touches nothing before the
// start deadline. No server, no clock.
func TestDecide(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	due, notDue := now.Add(-time.Minute), now.Add(time.Minute) // start deadlines
	pastTTL, beforeTTL := now.Add(-time.Second), now.Add(time.Hour)
	record := func(st engine.State, change func(r *engine.Record)) *engine.Record {
		r := &engine.Record{ExecutionID: "e1", CapabilityID: "email.send", State: st, Worker: "w-dead", Claim: "c-dead",
			LeaseUntil: now.Add(-time.Second)}
		if change != nil {
			change(r)
		}
		return r
	}
	live := func(r *engine.Record) { r.LeaseUntil = now.Add(time.Minute) }
	for _, tc := range []struct {
		name string
		f    Facts
		want Action
	}{
		{"before its start deadline: left to a pool's worker, whatever is there",
			Facts{StartDeadline: notDue, Envelope: engine.EnvelopeAbsent, AbsenceProves: true},
			Action{Do: Leave}},
		{"before its start deadline, an expired claim: left",
			Facts{StartDeadline: notDue, Record: record(engine.StateClaimed, nil)},
			Action{Do: Leave}},
		{"at its start deadline exactly: not yet past it",
			Facts{StartDeadline: now, Envelope: engine.EnvelopeAbsent, AbsenceProves: true},
			Action{Do: Leave}},
		{"an envelope, no record: nothing to end, the message is removed",
			Facts{StartDeadline: due, Envelope: engine.EnvelopePresent},
			Action{Do: Remove}},
		{"an envelope that could not be read, no record: left (unknown is not absent)",
			Facts{StartDeadline: due, Envelope: engine.EnvelopeUnknown, AbsenceProves: true},
			Action{Do: Leave}},
		{"an undecodable envelope, no record: left",
			Facts{StartDeadline: due, Envelope: engine.EnvelopeUndecodable},
			Action{Do: Leave}},
		{"no record, which proves that nothing started: NOT_STARTED",
			Facts{StartDeadline: due, Envelope: engine.EnvelopeAbsent, AbsenceProves: true},
			Action{Do: EndUnrun, Err: engine.NotStartedError()}},
		{"no record, which proves nothing: OUTCOME_UNKNOWN, never NOT_STARTED",
			Facts{StartDeadline: due, Envelope: engine.EnvelopeAbsent, AbsenceProves: false},
			Action{Do: EndUnrun, Err: engine.ExpiredRecordError()}},
		{"an expired claim: taken, NOT_STARTED",
			Facts{StartDeadline: due, TTLDeadline: beforeTTL, Record: record(engine.StateClaimed, nil)},
			Action{Do: End, Err: engine.NotStartedError()}},
		{"an expired claim marked WORKER_LOST: taken, OUTCOME_UNKNOWN",
			Facts{StartDeadline: due, Record: record(engine.StateClaimed, func(r *engine.Record) { r.LastError = envelope.CodeWorkerLost })},
			Action{Do: End, Err: engine.ExpiredRecordError()}},
		{"a live claim: left to its worker",
			Facts{StartDeadline: due, TTLDeadline: pastTTL, Record: record(engine.StateClaimed, live)},
			Action{Do: Leave}},
		{"a live running attempt past the TTL deadline: left to its worker",
			Facts{StartDeadline: due, TTLDeadline: pastTTL, Record: record(engine.StateRunning, func(r *engine.Record) { live(r); r.Attempt = 1 })},
			Action{Do: Leave}},
		{"a finalized record: its envelope restored",
			Facts{StartDeadline: due, Record: record(engine.StateFinalized, nil)},
			Action{Do: Restore}},
		{"a finalized record with a live-looking lease: its envelope restored",
			Facts{StartDeadline: due, Record: record(engine.StateFinalized, live)},
			Action{Do: Restore}},
		{"a cancel's pending record: taken, CANCELLED",
			Facts{StartDeadline: due, Record: &engine.Record{ExecutionID: "e1", State: engine.StatePending, CancelRequested: true}},
			Action{Do: End, Err: engine.CancelledError()}},
		{"a cancel on an expired running attempt: taken, CANCELLED with its attempts",
			Facts{StartDeadline: due, TTLDeadline: beforeTTL, Record: record(engine.StateRunning, func(r *engine.Record) { r.Attempt = 2; r.CancelRequested = true })},
			Action{Do: End, Err: engine.CancelledError(), Attempts: 2}},
		{"an expired running attempt past the TTL deadline: taken, OUTCOME_UNKNOWN",
			Facts{StartDeadline: due, TTLDeadline: pastTTL, Record: record(engine.StateRunning, func(r *engine.Record) { r.Attempt = 1 })},
			Action{Do: End, Err: engine.LostWorkerError(), Attempts: 1}},
		{"an expired backoff past the TTL deadline: taken, OUTCOME_UNKNOWN",
			Facts{StartDeadline: due, TTLDeadline: pastTTL, Record: record(engine.StateBackoff, func(r *engine.Record) { r.Attempt = 1 })},
			Action{Do: End, Err: engine.LostWorkerError(), Attempts: 1}},
		{"an expired running attempt before the TTL deadline: left to its pool's takeover",
			Facts{StartDeadline: due, TTLDeadline: beforeTTL, Record: record(engine.StateRunning, func(r *engine.Record) { r.Attempt = 1 })},
			Action{Do: Leave}},
		{"an expired backoff before the TTL deadline: left",
			Facts{StartDeadline: due, TTLDeadline: beforeTTL, Record: record(engine.StateBackoff, func(r *engine.Record) { r.Attempt = 1 })},
			Action{Do: Leave}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.f.Now = now
			if got := Decide(tc.f); !same(got, tc.want) {
				t.Errorf("Decide = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func same(a, b Action) bool {
	return a.Do == b.Do && a.Attempts == b.Attempts && sameErr(a.Err, b.Err)
}

func sameErr(a, b *envelope.CapabilityError) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Code == b.Code && a.Stage == b.Stage && a.Message == b.Message && a.Retryable == b.Retryable &&
		a.ExposeToModel == b.ExposeToModel
}
