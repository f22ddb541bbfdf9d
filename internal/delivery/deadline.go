package delivery

import (
	"errors"
	"time"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/broker"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/nats-io/nats.go/jetstream"
)

// DESIGN §13: every request ends. A request carries when it must have started
// (startBy, set by its client); a request no worker started by then ends
// failed / NOT_STARTED. The record TTL bounds it too: the exec stream drops a
// request at the record TTL (MaxAge), and a request is never claimed from
// scratch within ttlMargin of it. (A record itself goes one record window
// after its last write; a redelivery that finds none decides as
// checkedFresh says.) The check is a comparison on the delivery; the sweeper
// (sweep.go) ends the requests no worker is given.

// ttlMargin is how long before the record TTL a request stops being started.
func ttlMargin(ttl time.Duration) time.Duration { return min(ttl/10, time.Hour) }

// startDeadline is when a request stored at stored must have started: its
// startBy, and at the latest ttlMargin before its age reaches the record TTL.
func (w *Runner) startDeadline(stored time.Time, req *envelope.Request) time.Time {
	d := w.ttlDeadline(stored)
	if req.StartBy != nil && req.StartBy.Before(d) {
		d = *req.StartBy
	}
	return d
}

// ttlDeadline is when a request stored at stored must end: past it, nothing
// may start or retry it, and the sweeper finalizes what is left.
func (w *Runner) ttlDeadline(stored time.Time) time.Time {
	ttl := w.b.Config.RecordTTL
	return stored.Add(ttl - ttlMargin(ttl))
}

// NotStartedError is the envelope error of a request no worker started in time.
func NotStartedError() *envelope.CapabilityError {
	return &envelope.CapabilityError{Code: envelope.CodeNotStarted, Stage: envelope.StageQueue, ExposeToModel: true,
		Message: "No worker started the operation before its start deadline; it never ran."}
}

// notStartedEnvelope is the envelope of a request that never started.
func notStartedEnvelope(req *envelope.Request) *envelope.Envelope {
	return &envelope.Envelope{ExecutionID: req.ExecutionID, CapabilityID: req.CapabilityID, Status: envelope.StatusFailed,
		Error: NotStartedError().Wire()}
}

// startExpired reports whether the delivery's request is past its start
// deadline.
func (x *Execution) startExpired() bool {
	if x.msg == nil {
		return false
	}
	meta, err := x.msg.Metadata()
	if err != nil {
		return false
	}
	return time.Now().After(x.w.startDeadline(meta.Timestamp, x.req))
}

// finalizeRecorded writes the envelope a finalized record names and that was
// never written (its writer was lost between the two): only NOT_STARTED is
// recorded that way.
func (w *Runner) finalizeRecorded(x *Execution, rec *Record) bool {
	if rec.LastError != envelope.CodeNotStarted {
		return false
	}
	env := notStartedEnvelope(x.req)
	env.V, env.FinalizedBy, env.FinalizedAt = envelope.Version, w.cfg.ID, time.Now().UTC()
	ctx, cancel := StoreContext()
	defer cancel()
	_, err := broker.Create(ctx, w.b.Envelopes, x.key, env)
	if err == nil {
		x.emit(audit.Failed, notStartedData())
		w.finalized.Add(1)
	}
	return err == nil || errors.Is(err, broker.ErrExists)
}

func notStartedData() map[string]any {
	cerr := NotStartedError()
	return map[string]any{"code": string(cerr.Code), "stage": cerr.Stage, "retryable": false, "attempts": 0,
		"executedBeforeFailure": false}
}

// endedUnstarted ends a delivery whose request is past its start deadline
// and has no record, and reports whether it did; a request with a record is
// left to the takeover table.
func (w *Runner) endedUnstarted(msg jetstream.Msg, principal string, req *envelope.Request) bool {
	meta, err := msg.Metadata()
	if err != nil || !time.Now().After(w.startDeadline(meta.Timestamp, req)) {
		return false
	}
	x := &Execution{w: w, req: req, principal: principal, key: broker.Key(principal, req.ExecutionID)}
	x.hashInput()
	done, exists := w.finalizeWithoutRun(x, notStartedEnvelope(req), "")
	switch {
	case done:
		w.notStarted.Add(1)
		ackSync(msg)
	case exists:
		return false
	default:
		nak(msg, time.Second) // the store did not answer: decide again later
	}
	return true
}

// ttlExpired reports whether the delivery's request is past its TTL deadline.
func (x *Execution) ttlExpired() bool {
	if x.msg == nil {
		return false
	}
	meta, err := x.msg.Metadata()
	return err == nil && time.Now().After(x.w.ttlDeadline(meta.Timestamp))
}
