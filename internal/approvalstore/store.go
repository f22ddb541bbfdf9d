package approvalstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/auditemit"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/nats-io/nats.go/jetstream"
)

// Store keeps approvals in the approvals bucket. Every change is one
// compare-and-swap on the record's revision, so a store in every worker, client
// and CLI that shares the bucket agrees on who decided and who consumed.
type Store struct {
	kv    jetstream.KeyValue
	audit *auditemit.Emitter
	now   func() time.Time
	// skipped is told of each record a listing skipped (see OnSkipped).
	skipped func(key string, err error)
}

// OnSkipped has f told of every record a listing (List, ExpireDue)
// skips because it does not decode, with its key and the decoding error: one
// bad record is that approval's problem alone, never the listing's. The
// workers log and count them; it returns s.
func (s *Store) OnSkipped(f func(key string, err error)) *Store {
	s.skipped = f
	return s
}

// NewStore returns a store over the approvals bucket kv (nil: a store whose
// every operation fails with approvals.ErrNoBucket). Decisions are audited
// on em, with the approver as the acting actor; em may be nil for a store
// that only reads, creates and consumes.
func NewStore(kv jetstream.KeyValue, em *auditemit.Emitter) *Store {
	return &Store{kv: kv, audit: em, now: func() time.Time { return time.Now().UTC() }}
}

// Open returns a store over the existing approvals bucket of the deployment
// of the given prefix (default "CAPSTAN"), without provisioning anything: for
// approvers, who may read approvals but not create buckets. Decisions go
// through approvalsrpc.Decide.
func Open(ctx context.Context, js jetstream.JetStream, prefix string) (*Store, error) {
	kv, err := js.KeyValue(ctx, broker.NewNames(prefix).ApprovalsBucket())
	if err != nil {
		return nil, fmt.Errorf("capstan: open approvals: %w", err)
	}
	return &Store{kv: kv, now: func() time.Time { return time.Now().UTC() }}, nil
}

// maxTries bounds how often one operation re-reads after a lost or failed
// write. A lost CAS means someone else moved, and the next read says who.
const maxTries = 30

// Create stores a new pending approval. It fills V, Status, RequestedAt
// (if zero) and ExpiresAt (if zero: RequestedAt + DefaultTTL). The input must
// be canonical JSON hashing to InputHash (see Canonical).
func (s *Store) Create(ctx context.Context, r *approvals.Record) error {
	if err := envelope.ValidExecutionID(r.ID); err != nil {
		return fmt.Errorf("%w: id: %v", approvals.ErrInvalid, err)
	}
	if err := envelope.ValidExecutionID(r.RequestedBy); err != nil {
		return fmt.Errorf("%w: requestedBy: %v", approvals.ErrInvalid, err)
	}
	if r.CapabilityID == "" || r.Actor.Kind == "" {
		return fmt.Errorf("%w: an approval needs a capability and an actor", approvals.ErrInvalid)
	}
	if err := r.CheckInput(); err != nil {
		return err
	}
	if s.kv == nil {
		return approvals.ErrNoBucket
	}
	r.V = envelope.Version
	r.Status, r.Decision, r.ConsumedBy, r.ConsumedAt = approvals.StatusPending, nil, "", time.Time{}
	if r.RequestedAt.IsZero() {
		r.RequestedAt = s.now()
	}
	if r.ExpiresAt.IsZero() {
		r.ExpiresAt = r.RequestedAt.Add(DefaultTTL)
	}
	for try := 0; ; try++ {
		_, err := broker.Create(ctx, s.kv, r.ID, r)
		if err == nil {
			return nil
		}
		// The create may have happened with its answer lost: the record says.
		have, _, lerr := s.load(ctx, r.ID)
		if lerr == nil {
			if have.RequestedBy == r.RequestedBy && have.RequestedAt.Equal(r.RequestedAt) {
				return nil
			}
			return fmt.Errorf("%w: approval %s exists", broker.ErrExists, r.ID)
		}
		if try >= maxTries || ctx.Err() != nil {
			return fmt.Errorf("capstan: create approval %s: %w", r.ID, err)
		}
		pause(try)
	}
}

// Get reads one approval.
func (s *Store) Get(ctx context.Context, id string) (*approvals.Record, error) {
	r, _, err := s.load(ctx, id)
	return r, err
}

func (s *Store) load(ctx context.Context, id string) (*approvals.Record, uint64, error) {
	if s.kv == nil {
		return nil, 0, approvals.ErrNoBucket
	}
	if envelope.ValidExecutionID(id) != nil {
		return nil, 0, fmt.Errorf("%w: %q", approvals.ErrNotFound, id)
	}
	r, rev, err := broker.Load[approvals.Record](ctx, s.kv, id)
	if errors.Is(err, broker.ErrNotFound) {
		return nil, 0, notFound(id)
	}
	return r, rev, err
}

// Filter selects approvals; zero fields match everything.
type Filter struct {
	// Status as of now: an approval past its expiry lists as expired.
	Status approvals.Status
	// CapabilityID keeps the approvals of one capability.
	CapabilityID string
	// Actor is the requester (kind and id).
	Actor envelope.Actor
}

// List returns the approvals that match f, oldest first. A record that does
// not decode is skipped (and reported, see OnSkipped), never the listing's
// failure.
func (s *Store) List(ctx context.Context, f Filter) ([]*approvals.Record, error) {
	if s.kv == nil {
		return nil, approvals.ErrNoBucket
	}
	keys, err := s.kv.ListKeys(ctx)
	if err != nil {
		return nil, fmt.Errorf("capstan: list approvals: %w", err)
	}
	var ids []string
	for id := range keys.Keys() {
		ids = append(ids, id)
	}
	now := s.now()
	var out []*approvals.Record
	for _, id := range ids {
		r, _, err := s.load(ctx, id)
		if errors.Is(err, approvals.ErrNotFound) {
			continue // removed since it was listed
		}
		if errors.Is(err, envelope.ErrDecode) {
			// Whoever wrote it, it decides nothing for the others.
			if s.skipped != nil {
				s.skipped(id, err)
			}
			continue
		}
		if err != nil {
			return nil, err
		}
		if f.Status != "" && r.StatusAt(now) != f.Status ||
			f.CapabilityID != "" && r.CapabilityID != f.CapabilityID ||
			f.Actor.Kind+f.Actor.ID != "" && !sameActor(f.Actor, r.Actor) {
			continue
		}
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b *approvals.Record) int {
		if c := a.RequestedAt.Compare(b.RequestedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out, nil
}

// Decide approves or rejects a pending, unexpired approval, with one CAS from
// pending. The requester may not decide their own call without a
// SelfApproval reason (approvals.ErrSelfApproval). A decision on an approval
// that is no longer pending fails approvals.ErrAlreadyDecided, joined with
// the condition that decided it (approvals.ErrConsumed,
// approvals.ErrRejected...). The decision event is stored in the
// requesting execution's trail before Decide returns; should that fail, the
// decision stands and the error wraps audit.ErrUnavailable with the record.
func (s *Store) Decide(ctx context.Context, id string, v approvals.Verdict) (*approvals.Record, error) {
	if err := checkApprover(v.Approver); err != nil {
		return nil, err
	}
	status, event := approvals.StatusRejected, audit.EventRejected
	if v.Approve {
		status, event = approvals.StatusApproved, audit.EventApproved
	}
	var mine *approvals.Decision
	rec, err := s.update(ctx, id, func(r *approvals.Record, now time.Time) (*approvals.Record, error) {
		if mine != nil && r.Decision != nil && r.Decision.DecidedAt.Equal(mine.DecidedAt) && sameActor(r.Decision.Approver, v.Approver) {
			return nil, nil // our own write, whose answer was lost
		}
		if next := expire(r, now); next != nil {
			return next, approvals.ErrExpired
		}
		if r.Status != approvals.StatusPending {
			if err := statusError(r.Status, r, "", time.Time{}); err != nil {
				return nil, fmt.Errorf("%w: %w", approvals.ErrAlreadyDecided, err)
			}
			return nil, fmt.Errorf("%w: it is %s", approvals.ErrAlreadyDecided, r.Status)
		}
		if sameActor(v.Approver, r.Actor) && strings.TrimSpace(v.SelfApproval) == "" {
			return nil, approvals.ErrSelfApproval
		}
		if mine == nil {
			mine = &approvals.Decision{Status: status, Approver: v.Approver, Comment: v.Comment, DecidedAt: now, SelfApproval: v.SelfApproval}
		}
		next := *r
		next.Status, next.Decision = status, mine
		return &next, nil
	})
	if err != nil {
		return rec, err
	}
	data := map[string]any{"approvalId": rec.ID, "requester": rec.Actor.String()}
	if v.Comment != "" {
		data["comment"] = v.Comment
	}
	if v.SelfApproval != "" {
		data["selfApproval"] = v.SelfApproval
	}
	return rec, s.emitDecision(ctx, rec, event, v.Approver, data)
}

// Consume marks an approved approval as used by executionID, whose
// execution record was created at under (execution.Record.CreatedAt), with
// one CAS from approved. An approval authorizes one execution for as long as
// it exists, and its own record is the proof of use (DESIGN §7): consuming
// again succeeds only for the same execution under the same execution record
// (a takeover or redelivery of it while it is in flight, its record alive);
// for any other execution, or for the same id under a record made since its
// first one expired, it fails approvals.ErrConsumed. An approval past its
// expiry fails approvals.ErrExpired; one whose stored input no longer hashes
// to InputHash fails approvals.ErrInputMismatch.
func (s *Store) Consume(ctx context.Context, id, executionID string, under time.Time) (*approvals.Record, error) {
	if err := envelope.ValidExecutionID(executionID); err != nil {
		return nil, fmt.Errorf("%w: execution id: %v", approvals.ErrInvalid, err)
	}
	if under.IsZero() {
		return nil, fmt.Errorf("%w: consumed under no execution record", approvals.ErrInvalid)
	}
	return s.update(ctx, id, func(r *approvals.Record, now time.Time) (*approvals.Record, error) {
		if consumedUnder(r, executionID, under) {
			return nil, r.CheckInput() // our execution's, or our own write whose answer was lost
		}
		if next := expire(r, now); next != nil {
			return next, approvals.ErrExpired
		}
		if err := statusError(r.Status, r, executionID, under); err != nil {
			return nil, err
		}
		if err := r.CheckInput(); err != nil {
			return nil, err
		}
		next := *r
		next.Status, next.ConsumedBy, next.ConsumedAt, next.ConsumedUnder = approvals.StatusConsumed, executionID, now, under.UTC()
		return &next, nil
	})
}

// Cancel withdraws a pending or approved approval before it is used; the
// canceller is recorded as the decision's actor and the trail shows a
// rejection with status cancelled.
func (s *Store) Cancel(ctx context.Context, id string, by envelope.Actor, reason string) (*approvals.Record, error) {
	if by.Kind == "" {
		return nil, fmt.Errorf("%w: a cancel needs an actor", approvals.ErrInvalid)
	}
	var mine *approvals.Decision
	rec, err := s.update(ctx, id, func(r *approvals.Record, now time.Time) (*approvals.Record, error) {
		if mine != nil && r.Decision != nil && r.Decision.DecidedAt.Equal(mine.DecidedAt) && sameActor(r.Decision.Approver, by) {
			return nil, nil // our own write, whose answer was lost
		}
		if next := expire(r, now); next != nil {
			return next, approvals.ErrExpired
		}
		if r.Status != approvals.StatusPending && r.Status != approvals.StatusApproved {
			return nil, statusError(r.Status, r, "", time.Time{})
		}
		if mine == nil {
			mine = &approvals.Decision{Status: approvals.StatusCancelled, Approver: by, Comment: reason, DecidedAt: now}
		}
		next := *r
		next.Status, next.Decision = approvals.StatusCancelled, mine
		return &next, nil
	})
	if err != nil {
		return rec, err
	}
	data := map[string]any{"approvalId": rec.ID, "requester": rec.Actor.String(), "status": string(approvals.StatusCancelled)}
	if reason != "" {
		data["comment"] = reason
	}
	return rec, s.emitDecision(ctx, rec, audit.EventRejected, by, data)
}

// ExpireDue marks every pending or approved approval past its expiry as
// expired and returns how many it changed. Expiry holds without it (every
// decision and consumption checks the time); it keeps listings honest.
func (s *Store) ExpireDue(ctx context.Context) (int, error) {
	all, err := s.List(ctx, Filter{Status: approvals.StatusExpired})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, r := range all {
		if r.Status == approvals.StatusExpired {
			continue
		}
		_, err := s.update(ctx, r.ID, func(r *approvals.Record, now time.Time) (*approvals.Record, error) {
			if next := expire(r, now); next != nil {
				return next, nil
			}
			return nil, errNotChanged
		})
		switch {
		case err == nil:
			n++
		case errors.Is(err, errNotChanged), errors.Is(err, approvals.ErrNotFound):
		default:
			return n, err
		}
	}
	return n, nil
}

var errNotChanged = errors.New("not changed")

// expire returns the expired version of a pending or approved record whose
// expiry has passed, or nil.
func expire(r *approvals.Record, now time.Time) *approvals.Record {
	if (r.Status != approvals.StatusPending && r.Status != approvals.StatusApproved) || r.StatusAt(now) != approvals.StatusExpired {
		return nil
	}
	next := *r
	next.Status = approvals.StatusExpired
	return &next
}

// update loads the approval and lets step decide from what is there: step
// returns the record to write (nil: write nothing) and the error the
// operation ends with. Any failed write, a lost CAS or an error that may hide
// a write that happened, re-reads and asks step again (DESIGN §5).
func (s *Store) update(ctx context.Context, id string, step func(r *approvals.Record, now time.Time) (*approvals.Record, error)) (*approvals.Record, error) {
	for try := 0; ; try++ {
		r, rev, err := s.load(ctx, id)
		if err != nil {
			if errors.Is(err, approvals.ErrNotFound) || errors.Is(err, approvals.ErrNoBucket) || errors.Is(err, envelope.ErrDecode) || try >= maxTries || ctx.Err() != nil {
				return nil, err
			}
			pause(try)
			continue
		}
		next, result := step(r, s.now())
		if next == nil {
			return r, result
		}
		if _, err = broker.Update(ctx, s.kv, id, next, rev); err == nil {
			return next, result
		}
		if try >= maxTries || ctx.Err() != nil {
			return nil, fmt.Errorf("capstan: approval %s: %w", id, err)
		}
		if !errors.Is(err, broker.ErrRevisionMismatch) {
			pause(try)
		}
	}
}

func pause(try int) {
	d := time.Duration(10*(try+1)) * time.Millisecond
	time.Sleep(min(d, 500*time.Millisecond))
}

func (s *Store) emitDecision(ctx context.Context, r *approvals.Record, typ string, by envelope.Actor, data map[string]any) error {
	if s.audit == nil {
		return nil
	}
	err := s.audit.EmitSync(ctx, &audit.Event{
		Type: typ, Surface: r.Surface, Actor: audit.ActorOf(by), Principal: r.Principal, ExecutionID: r.RequestedBy,
		CapabilityID: r.CapabilityID, CorrelationID: r.CorrelationID, InputHash: r.InputHash, Data: data,
	})
	if err != nil {
		return fmt.Errorf("capstan: approval %s is %s, but its audit event was not stored: %w", r.ID, r.Status, err)
	}
	return nil
}
