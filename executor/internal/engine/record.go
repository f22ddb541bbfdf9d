package engine

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/capstan-dev/capstan/envelope"
	execrec "github.com/capstan-dev/capstan/execution"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/nats-io/nats.go"
)

// Record and State are the public execution record (package execution),
// named here for brevity.
type (
	Record = execrec.Record
	State  = execrec.State
)

// Record states.
const (
	StatePending   = execrec.StatePending
	StateClaimed   = execrec.StateClaimed
	StateRunning   = execrec.StateRunning
	StateBackoff   = execrec.StateBackoff
	StateFinalized = execrec.StateFinalized
	// StateReconciling: a takeover asks the capability's reconciler whether
	// the lost attempt took effect (DESIGN §5, receipts and reconcilers).
	StateReconciling = execrec.StateReconciling
)

// receiptOf returns the receipt attempt n recorded in r, nil when it
// recorded none (or the record is of another attempt).
func receiptOf(r *Record, n int) envelope.Raw {
	if n == 0 || r.ReceiptAttempt != n || len(r.Receipt) == 0 {
		return nil
	}
	return r.Receipt
}

// lostReceipt returns the receipt of the attempt a takeover finds lost in
// r: an attempt that was running (its handler may have returned nothing)
// and recorded one.
func lostReceipt(r *Record) envelope.Raw {
	if r.State != StateRunning {
		return nil
	}
	return receiptOf(r, r.Attempt)
}

// conflict names the first field in which req, whose input hashes to
// inputHash, differs from the request the record was claimed for, or
// returns "" when it is that request. A producer chooses its execution ids
// and its message ids: it may publish a second, different request under the
// id of one of its executions, and a takeover, which runs only the handler,
// must never run that one on the strength of the first one's stages,
// policies and approval. A record that names no capability (a cancel's
// pending record, before any claim) holds no request yet, and a record
// written before a field existed is not compared on it.
//
// A claimed record's approval id is also the one its call reserved when it
// asked for an approval (awaitApproval), before storing it and ending
// approval-required: a request that resumes nothing is still the one such a
// record was claimed for, and its redelivery takes the execution over, from
// the top, and finds the same approval. Past the claim (an attempt started),
// the approval id is only ever the one the execution resumes, and a request
// resuming nothing is another one.
func conflict(r *Record, req *envelope.Request, inputHash string) string {
	if r.CapabilityID == "" {
		return ""
	}
	switch {
	case r.CapabilityID != req.CapabilityID:
		return "capabilityId"
	case r.ApprovalID != req.ApprovalID && (req.ApprovalID != "" || r.State != StateClaimed):
		return "approvalId"
	case r.Actor != "" && r.Actor != actorKey(req.Actor):
		return "actor"
	case r.Surface != "" && r.Surface != req.Surface:
		return "surface"
	case r.InputHash != "" && r.InputHash != inputHash:
		return "inputHash"
	}
	return ""
}

// claimedFor records in r the request it is claimed for (see conflict).
func claimedFor(r *Record, req *envelope.Request, inputHash string) {
	r.CapabilityID, r.ApprovalID = req.CapabilityID, req.ApprovalID
	r.Actor, r.Surface, r.InputHash = actorKey(req.Actor), req.Surface, inputHash
}

// actorKey is the actor as a record keeps it: kind:id, or "" for none.
func actorKey(a envelope.Actor) string {
	if a.Kind == "" && a.ID == "" {
		return ""
	}
	return a.String()
}

// store holds what a worker writes of its executions: records, changed only
// by compare-and-swap on their revision, and envelopes, created once (DESIGN
// §5). Each operation is bounded on its own; a write the store does not
// answer is tried again, up to storeOutage.
type store struct {
	b   *broker.Broker
	nc  *nats.Conn
	log *slog.Logger
	// lease is the claims' lease, which bounds one operation on a record.
	lease time.Duration
	now   func() time.Time
	// shutdown ends when the worker shuts down: writes then give up sooner.
	shutdown context.Context
}

// opCtx bounds one operation on a record: short against the lease, so that
// a request lost with a server is sent again (to its restart, or to another
// node) while the lease still holds.
func (s *store) opCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), opTimeout(s.lease))
}

// opTimeout is how long one operation on a record may take under a lease.
func opTimeout(lease time.Duration) time.Duration {
	return min(max(lease/4, 250*time.Millisecond), 10*time.Second)
}

// StoreContext bounds one store operation; it is not tied to the execution,
// whose cancellation must not stop it from recording its own end.
func StoreContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 10*time.Second)
}

// storeOutage is how long a worker keeps trying a write that the store does
// not answer: longer than a replicated bucket takes to elect a new leader.
const storeOutage = time.Minute

// givesUp reports whether a write tried since start should stop: after
// storeOutage, or after a few tries once the worker is shutting down.
func (s *store) givesUp(start time.Time, try int) bool {
	if s.shutdown.Err() != nil {
		return try >= 20
	}
	return try >= 20 && s.now().Sub(start) > storeOutage
}

// ttl is the TTL a write of rec carries (DESIGN §16): the record window,
// and, while rec is not finalized, at least what is left of its lease.
func (s *store) ttl(rec *Record) time.Duration {
	return recordTTL(rec, s.b.Config.RecordWindow, s.now())
}

// recordTTL is the TTL of a write of rec at now under the record window: the
// window, and, while rec is not finalized, at least what is left of its
// lease (in whole seconds, rounded up). A window shorter than the lease
// would let a running execution's record expire between two renewals: its
// worker would take the execution for lost, and a redelivery would find no
// record where a live lease stands.
func recordTTL(rec *Record, window time.Duration, now time.Time) time.Duration {
	ttl := window
	if rec.State != StateFinalized {
		if left := rec.LeaseUntil.Sub(now); left > ttl {
			ttl = left.Truncate(time.Second) + time.Second
		}
	}
	return ttl
}

// create writes an execution's first record, create-only, bounded as
// opCtx bounds an operation (by the connection's timer: no context is made
// for it).
func (s *store) create(key string, rec *Record) (uint64, error) {
	return s.b.CreateWithin(opTimeout(s.lease), s.b.Executions, key, rec, s.ttl(rec))
}

// swap writes rec over the revision rev, or fails.
func (s *store) swap(key string, rec *Record, rev uint64) (uint64, error) {
	ctx, cancel := s.opCtx()
	defer cancel()
	return broker.UpdateTTL(ctx, s.b.JS, s.b.Executions, key, rec, rev, s.ttl(rec))
}

// load reads a record and its revision.
func (s *store) load(key string) (*Record, uint64, error) {
	ctx, cancel := s.opCtx()
	defer cancel()
	return broker.Load[Record](ctx, s.b.Executions, key)
}

// envelope reads an execution's envelope: nil, nil when there is none.
func (s *store) envelope(key string) (*envelope.Envelope, error) {
	ctx, cancel := StoreContext()
	defer cancel()
	env, _, err := broker.Load[envelope.Envelope](ctx, s.b.Envelopes, key)
	if errors.Is(err, broker.ErrNotFound) {
		// A replica catching up after a restart may not have it yet: the
		// stream's leader decides.
		env, _, err = broker.LoadFromLeader[envelope.Envelope](ctx, s.nc, s.b.Envelopes, key)
	}
	if errors.Is(err, broker.ErrNotFound) {
		return nil, nil
	}
	return env, err
}

// storedEnvelope reads the envelope a create was refused for. An absence is
// confirmed with the stream's leader: a replica catching up after a restart
// may not have the envelope yet.
func (s *store) storedEnvelope(key string) (*envelope.Envelope, error) {
	var err error
	for try := 0; try < 5; try++ {
		ctx, cancel := StoreContext()
		var have *envelope.Envelope
		have, _, err = broker.Load[envelope.Envelope](ctx, s.b.Envelopes, key)
		if errors.Is(err, broker.ErrNotFound) {
			have, _, err = broker.LoadFromLeader[envelope.Envelope](ctx, s.nc, s.b.Envelopes, key)
		}
		cancel()
		if err == nil {
			return have, nil
		}
		if errors.Is(err, broker.ErrNotFound) {
			return nil, err
		}
		time.Sleep(broker.Backoff(try))
	}
	return nil, err
}

// createEnvelope writes env once, create-only, as sealed holds it (see
// seal; env encoded here when sealed holds nothing).
// It is bounded as opCtx bounds an operation, by the connection's timer.
func (s *store) createEnvelope(key string, env *envelope.Envelope, sealed sealed) error {
	_, err := s.b.CreateWithin(opTimeout(s.lease), s.b.Envelopes, key, sealedOr(sealed, env), 0)
	return err
}

// createEnvelopeIn is createEnvelope within ctx.
func (s *store) createEnvelopeIn(ctx context.Context, key string, env *envelope.Envelope, sealed sealed) (uint64, error) {
	return s.b.Create(ctx, s.b.Envelopes, key, sealedOr(sealed, env), 0)
}

// sealedOr is what a create of env writes: the bytes sealed holds, or env
// itself when it holds none.
func sealedOr(s sealed, env *envelope.Envelope) any {
	if !s.ok {
		return env
	}
	return envelope.Raw(s.enc.Bytes())
}
