package pauses

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/oplog"
)

// ErrNotPaused: the scope an unpause names has no pause.
var ErrNotPaused = errors.New("capstan: not paused")

// ErrChanged: another operator changed the scope's pause between the read
// and the write; nothing was changed.
var ErrChanged = errors.New("capstan: the pause changed meanwhile")

// Bucket opens the pauses bucket; with create, a missing one is created
// (an admin's right: workers only read it). Without create, a missing bucket
// is jetstream.ErrBucketNotFound: nothing was ever paused.
func Bucket(ctx context.Context, js jetstream.JetStream, n broker.Names, create bool) (jetstream.KeyValue, error) {
	return broker.OperatorBucket(ctx, js, n.PausesBucket(), create)
}

// ErrIgnored: the bucket holds records that are no pause a worker honours
// (written by hand, or in another shape); List names them.
var ErrIgnored = errors.New("capstan: the pauses bucket holds records every worker ignores")

// List returns every pause in the bucket that the workers honour, by scope,
// and, wrapping ErrIgnored, what is wrong with each record they ignore.
func List(ctx context.Context, nc *nats.Conn, kv jetstream.KeyValue) ([]*Pause, error) {
	keys, err := kv.ListKeys(ctx)
	if err != nil {
		return nil, err
	}
	var out []*Pause
	var ignored []error
	for k := range keys.Keys() {
		// What a worker reads of it (get): one that does not decode, or
		// that another stream stored, with its revision still.
		p, rev, err := get(ctx, nc, kv, k)
		if err == nil {
			err = honoured(k, p)
		}
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			continue
		case err != nil && (rev > 0 || p != nil):
			ignored = append(ignored, err)
			continue
		case err != nil:
			return nil, err
		}
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b *Pause) int { return a.At.Compare(b.At) })
	if len(ignored) > 0 {
		return out, fmt.Errorf("%w: %w", ErrIgnored, errors.Join(ignored...))
	}
	return out, nil
}

func get(ctx context.Context, nc *nats.Conn, kv jetstream.KeyValue, key string) (*Pause, uint64, error) {
	return oplog.Read[Pause](ctx, nc, kv, key, "pause "+key)
}

// Change is what Apply or Lift did.
type Change struct {
	// Pause is the pause now in force (Apply), or the one lifted (Lift).
	Pause *Pause `json:"pause"`
	// Replaced is the pause Apply replaced on the same scope, if any.
	Replaced *Pause `json:"replaced,omitempty"`
	// Revision is the bucket's revision of the change: a worker whose copy
	// has it applies the change.
	Revision uint64 `json:"revision"`
	// AuditID is the trail's id of the change's event, under the
	// principal who made it.
	AuditID string `json:"auditId"`
}

// Apply puts p in force, replacing any pause of the same scope, as the admin
// p.By: first its event on the trail (acknowledged), then the bucket, by
// compare-and-swap on what was read. An error leaves the bucket unchanged;
// when the trail had taken the event, an operator.not_applied event follows
// it (best effort) so that the trail says so.
func Apply(ctx context.Context, nc *nats.Conn, n broker.Names, p *Pause) (*Change, error) {
	if p.V == 0 {
		p.V = envelope.Version
	}
	if p.At.IsZero() {
		p.At = time.Now().UTC()
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	kv, err := oplog.OpenBucket(ctx, nc, n.PausesBucket(), true)
	if err != nil {
		return nil, fmt.Errorf("capstan: pauses bucket: %w", err)
	}
	key := p.Scope.Key()
	var prev *Pause
	var prevRev uint64
	if err := oplog.Retry(ctx, func(ctx context.Context) (err error) {
		prev, prevRev, err = get(ctx, nc, kv, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) || err != nil && prevRev > 0 {
			return nil // none, or one that does not decode: replaced all the same
		}
		return err
	}); err != nil {
		return nil, fmt.Errorf("capstan: read the pause of %s: %w", p.Scope, err)
	}
	p.AuditID = envelope.NewExecutionID()
	data := map[string]any{"scope": p.Scope.String(), "key": key, "mode": string(p.Mode), "reason": p.Reason,
		"cancelRunning": p.CancelRunning}
	if prev != nil {
		data["replaces"] = prev.AuditID
	}
	log := oplog.New(nc, n, p.By, p.Operator)
	if err := log.Record(ctx, audit.EventPaused, p.AuditID, p.Scope.Capability, data); err != nil {
		return nil, fmt.Errorf("capstan: not paused: the audit trail did not take the event: %w", err)
	}
	b, err := json.Marshal(p)
	if err != nil {
		return nil, err
	}
	rev, err := oplog.Write(ctx, kv, key, b, prevRev, func(ctx context.Context) (uint64, bool) {
		// The last try may have been stored unanswered: ours is there.
		have, r, err := get(ctx, nc, kv, key)
		return r, err == nil && have.AuditID == p.AuditID
	})
	if err != nil {
		return nil, notApplied(ctx, log, p.AuditID, p.Scope, err)
	}
	return &Change{Pause: p, Replaced: prev, Revision: rev, AuditID: p.AuditID}, nil
}

// Lift removes the pause of scope, as the admin by (operator at the
// keyboard), for reason: its event on the trail first, then the bucket, by
// compare-and-swap. ErrNotPaused when the scope has no pause.
func Lift(ctx context.Context, nc *nats.Conn, n broker.Names, scope Scope, by, operator, reason string) (*Change, error) {
	if err := scope.Validate(); err != nil {
		return nil, err
	}
	if strings.TrimSpace(reason) == "" {
		return nil, errors.New("a reason is required: it goes on the trail")
	}
	if len(reason) > MaxReason {
		return nil, fmt.Errorf("reason: at most %d bytes", MaxReason)
	}
	kv, err := oplog.OpenBucket(ctx, nc, n.PausesBucket(), false)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, fmt.Errorf("%w: %s (nothing was ever paused)", ErrNotPaused, scope)
	}
	if err != nil {
		return nil, fmt.Errorf("capstan: pauses bucket: %w", err)
	}
	key := scope.Key()
	var prev *Pause
	var prevRev uint64
	err = oplog.Retry(ctx, func(ctx context.Context) (err error) {
		prev, prevRev, err = get(ctx, nc, kv, key)
		return err
	})
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return nil, fmt.Errorf("%w: %s", ErrNotPaused, scope)
	case err != nil && prevRev == 0:
		return nil, fmt.Errorf("capstan: read the pause of %s: %w", scope, err)
	case prev == nil:
		prev = &Pause{Scope: scope} // unreadable, still removable
	}
	id := envelope.NewExecutionID()
	log := oplog.New(nc, n, by, operator)
	data := map[string]any{"scope": scope.String(), "key": key, "reason": reason, "pauseAuditId": prev.AuditID}
	if !prev.At.IsZero() {
		data["pausedForMs"] = time.Since(prev.At).Milliseconds()
	}
	if err := log.Record(ctx, audit.EventUnpaused, id, scope.Capability, data); err != nil {
		return nil, fmt.Errorf("capstan: not unpaused: the audit trail did not take the event: %w", err)
	}
	tried := false
	err = oplog.Retry(ctx, func(ctx context.Context) error {
		if tried {
			// The last try may have been stored unanswered: the pause is gone.
			if _, _, gerr := get(ctx, nc, kv, key); errors.Is(gerr, jetstream.ErrKeyNotFound) {
				return nil
			}
		}
		tried = true
		return kv.Delete(ctx, key, jetstream.LastRevision(prevRev))
	})
	if err != nil {
		return nil, notApplied(ctx, log, id, scope, err)
	}
	// The delete's revision: the newest of the bucket, read back.
	rev := prevRev + 1
	_ = oplog.Retry(ctx, func(ctx context.Context) error {
		js, err := jetstream.New(nc)
		if err != nil {
			return err
		}
		s, err := js.Stream(ctx, "KV_"+n.PausesBucket())
		if err == nil {
			rev = max(rev, s.CachedInfo().State.LastSeq)
		}
		return err
	})
	return &Change{Pause: prev, Revision: rev, AuditID: id}, nil
}

// notApplied files that the change recorded under id did not reach the
// bucket, and returns the error to report.
func notApplied(ctx context.Context, log *oplog.Log, id string, scope Scope, cause error) error {
	return log.NotApplied(ctx, id, scope.Capability, "pauses", cause,
		fmt.Errorf("%w: another operator changed the pause of %s; nothing changed (run the command again)", ErrChanged, scope))
}
