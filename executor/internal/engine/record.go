package engine

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/capstan-dev/capstan/broker"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/nats-io/nats.go"
	"github.com/vmihailenco/msgpack/v5"
)

// State is an execution record's state (DESIGN §5).
type State string

// Record states.
const (
	// StatePending: a cancel arrived before any worker claimed the execution.
	StatePending   State = "pending"
	StateClaimed   State = "claimed"
	StateRunning   State = "running"
	StateBackoff   State = "backoff"
	StateFinalized State = "finalized"
	// StateReconciling: a takeover asks the capability's reconciler whether
	// the lost attempt (Attempt) took effect, under its claim and lease as an
	// attempt runs (DESIGN §5, receipts and reconcilers).
	StateReconciling State = "reconciling"
)

// Record is an execution's one record in the executions bucket, changed only
// by compare-and-swap on its revision. The claim named in it owns the
// execution while its lease lasts: a random token each claim or takeover
// draws, never the worker's id, which two processes may share.
type Record struct {
	V            int    `json:"v"`
	ExecutionID  string `json:"executionId"`
	CapabilityID string `json:"capabilityId"`
	State        State  `json:"state"`
	// Attempt is the number of the attempt running, or the last one started.
	Attempt int    `json:"attempt"`
	Worker  string `json:"worker,omitempty"`
	// Claim is the owning claim's random token.
	Claim      string    `json:"claim,omitempty"`
	LeaseUntil time.Time `json:"leaseUntil,omitzero"`
	// StartedAt is when the current attempt started.
	StartedAt time.Time `json:"startedAt,omitzero"`
	// LastError is the failed attempt's code in backoff, the envelope's
	// code once finalized, and WORKER_LOST on a claim made where finding no
	// record did not prove that no attempt had started: its takeover never
	// runs it from the top unless a retry is allowed (DESIGN §5).
	LastError envelope.Code `json:"lastError,omitempty"`
	// CancelRequested may be set in any state before finalized; it is terminal.
	CancelRequested   bool      `json:"cancelRequested,omitempty"`
	CancelRequestedAt time.Time `json:"cancelRequestedAt,omitzero"`
	ApprovalID        string    `json:"approvalId,omitempty"`
	// Actor (kind:id), Surface and InputHash, with CapabilityID and
	// ApprovalID, name the request the record was claimed for: only that
	// request takes the execution over (see Conflict). Records written before
	// they existed lack them.
	Actor     string `json:"actor,omitempty"`
	Surface   string `json:"surface,omitempty"`
	InputHash string `json:"inputHash,omitempty"`
	// Status is the envelope's status once finalized.
	Status envelope.Status `json:"status,omitempty"`
	// Cause is a failure's private cause, for operators: it never reaches the
	// envelope, the model or the audit trail.
	Cause     string    `json:"cause,omitempty"`
	CreatedAt time.Time `json:"createdAt"`
	UpdatedAt time.Time `json:"updatedAt"`

	// Receipts and reconcilers (DESIGN §5). Receipt is the evidence attempt
	// ReceiptAttempt recorded of its effect, at ReceiptAt, written by that
	// attempt's claim (a lost lease cannot write it): a takeover of the
	// attempt finalizes completed from it. A new attempt clears it.
	Receipt        envelope.Raw `json:"receipt,omitempty"`
	ReceiptAttempt int          `json:"receiptAttempt,omitempty"`
	ReceiptAt      time.Time    `json:"receiptAt,omitzero"`
	// Reconciliations counts the reconciliations started for Attempt: those
	// lost with their workers are bounded (maxReconciliations).
	Reconciliations int `json:"reconciliations,omitempty"`
	// Reattempts counts the attempts started because a reconciler proved the
	// effect of the one before absent: bounded by the capability.
	Reattempts int `json:"reattempts,omitempty"`
}

// receiptOf returns the receipt attempt n recorded, nil when it recorded
// none (or the record is of another attempt).
func (r *Record) receiptOf(n int) envelope.Raw {
	if n == 0 || r.ReceiptAttempt != n || len(r.Receipt) == 0 {
		return nil
	}
	return r.Receipt
}

// lostReceipt returns the receipt of the attempt a takeover finds lost: an
// attempt that was running (its handler may have returned nothing) and
// recorded one.
func (r *Record) lostReceipt() envelope.Raw {
	if r.State != StateRunning {
		return nil
	}
	return r.receiptOf(r.Attempt)
}

// InFlight reports whether the record is of an execution that may still
// write its envelope: not finalized, and waiting for its first claim (a
// cancel's pending record) or held by a live lease. A record is not
// rewritten after its envelope (DESIGN §14): one whose lease ran out says
// nothing more of its outcome.
func (r *Record) InFlight(now time.Time) bool {
	switch r.State {
	case StateFinalized:
		return false
	case StatePending:
		return true
	}
	return now.Before(r.LeaseUntil)
}

// Conflict names the first field in which req, whose input hashes to
// inputHash, differs from the request the record was claimed for, or
// returns "" when it is that request. A producer chooses its execution ids
// and its message ids: it may publish a second, different request under the
// id of one of its executions, and a takeover, which runs only the handler,
// must never run that one on the strength of the first one's stages,
// policies and approval. A record that names no capability (a cancel's
// pending record, before any claim) holds no request yet, and a record
// written before a field existed is not compared on it.
func (r *Record) Conflict(req *envelope.Request, inputHash string) string {
	if r.CapabilityID == "" {
		return ""
	}
	switch {
	case r.CapabilityID != req.CapabilityID:
		return "capabilityId"
	case r.ApprovalID != req.ApprovalID:
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

// claimedFor records in r the request it is claimed for (see Conflict).
func (r *Record) claimedFor(req *envelope.Request, inputHash string) {
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

// Leased reports whether a claim holds the record under a lease that has
// not run out at now (a cancel's pending record names no claim).
func (r *Record) Leased(now time.Time) bool {
	return (r.Worker != "" || r.Claim != "") && now.Before(r.LeaseUntil)
}

// EncodeMsgpack writes the record without reflection: it is written three
// times per execution. A field added to Record is added here too, in
// declaration order (TestRecordEncoder_WritesTheReflectiveEncodersBytes
// fails until it is).
func (r Record) EncodeMsgpack(enc *msgpack.Encoder) error {
	var f envelope.Fields
	f.Int("v", int64(r.V))
	f.String("executionId", r.ExecutionID)
	f.String("capabilityId", r.CapabilityID)
	f.String("state", string(r.State))
	f.Int("attempt", int64(r.Attempt))
	f.String("worker", r.Worker)
	f.String("claim", r.Claim)
	f.Time("leaseUntil", r.LeaseUntil)
	f.Time("startedAt", r.StartedAt)
	f.String("lastError", string(r.LastError))
	f.Bool("cancelRequested", r.CancelRequested)
	f.Time("cancelRequestedAt", r.CancelRequestedAt)
	f.String("approvalId", r.ApprovalID)
	f.String("actor", r.Actor)
	f.String("surface", r.Surface)
	f.String("inputHash", r.InputHash)
	f.String("status", string(r.Status))
	f.String("cause", r.Cause)
	f.Time("createdAt", r.CreatedAt)
	f.Time("updatedAt", r.UpdatedAt)
	f.Raw("receipt", r.Receipt)
	f.Int("receiptAttempt", int64(r.ReceiptAttempt))
	f.Time("receiptAt", r.ReceiptAt)
	f.Int("reconciliations", int64(r.Reconciliations))
	f.Int("reattempts", int64(r.Reattempts))
	return f.Encode(enc)
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

// create writes an execution's first record, create-only.
func (s *store) create(key string, rec *Record) (uint64, error) {
	ctx, cancel := s.opCtx()
	defer cancel()
	return s.b.Create(ctx, s.b.Executions, key, rec, s.ttl(rec))
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

// createEnvelope writes env once, create-only.
func (s *store) createEnvelope(key string, env *envelope.Envelope) error {
	ctx, cancel := s.opCtx()
	defer cancel()
	_, err := s.b.Create(ctx, s.b.Envelopes, key, env, 0)
	return err
}
