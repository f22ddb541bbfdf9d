// Package oplog is how an operator's change to the deployment is made
// (DESIGN §18): a pause, a lift, a policy set put in force. The change's
// event goes on the audit trail first, acknowledged; then the bucket is
// written, by compare-and-swap; and when the write fails after the trail
// took the event, an operator.not_applied event says so. Each step is tried
// again while no server answers in time (a cluster electing a leader after
// a node was lost), so that a command run in the middle of an incident does
// what it says or, having changed nothing, says that.
package oplog

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

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/kvwatch"
)

// Retry runs step until it succeeds, fails otherwise than by no server
// answering in time, or ctx ends; each try has its own bound. A step that
// may have taken effect unanswered must check, before it tries again,
// whether it did.
func Retry(ctx context.Context, step func(ctx context.Context) error) error {
	for try := 0; ; try++ {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := step(sctx)
		cancel()
		if err == nil || !broker.Unreachable(err) || ctx.Err() != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(min(250*time.Millisecond<<min(try, 3), 2*time.Second)):
		}
	}
}

// OpenBucket opens the operators' bucket name (broker.OperatorBucket) as
// Retry tries it; with create, a missing one is created (an admin's right).
func OpenBucket(ctx context.Context, nc *nats.Conn, name string, create bool) (jetstream.KeyValue, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	var kv jetstream.KeyValue
	err = Retry(ctx, func(ctx context.Context) (err error) {
		kv, err = broker.OperatorBucket(ctx, js, name, create)
		return err
	})
	return kv, err
}

// Read returns the JSON value a bucket holds under key, and its revision.
// A value that does not decode is an error that names it what, with the
// revision still: a revision of 0 with an error says the key was not read.
// An absence a direct get answers (any replica of a cluster may, one behind
// the stream's leader among them) is asked again of the leader, on nc: what
// an operator's change is made from and what a worker loads is never a
// replica's lag (jetstream.ErrKeyNotFound only when the leader says so).
func Read[T any](ctx context.Context, nc *nats.Conn, kv jetstream.KeyValue, key, what string) (*T, uint64, error) {
	data, rev, err := broker.GetConfirmed(ctx, nc, kv, key)
	if errors.Is(err, broker.ErrNotFound) {
		return nil, 0, jetstream.ErrKeyNotFound
	}
	if err != nil {
		return nil, 0, err
	}
	// Stored by another stream's republish (what a worker can do), it is
	// no operator's: an error, with the revision a change replaces it from
	// (the headers it was stored with stand where the read above takes its
	// revision from).
	if from, seq, err := kvwatch.LastRepublished(ctx, nc, kv.Bucket(), key); err == nil && from != "" {
		return nil, seq, fmt.Errorf("capstan: %s was stored by stream %s's republish, not by an admin: no worker honours it", what, from)
	}
	var v T
	if err := json.Unmarshal(data, &v); err != nil {
		return nil, rev, fmt.Errorf("capstan: %s does not decode: %w", what, err)
	}
	return &v, rev, nil
}

// Write writes a bucket's key by compare-and-swap, as Retry tries it:
// create when prevRev is 0, else update from prevRev; before a try after
// the first, stored says whether the last one was stored unanswered (and
// its revision), so that it is not written twice. It returns the write's
// revision.
func Write(ctx context.Context, kv jetstream.KeyValue, key string, value []byte, prevRev uint64,
	stored func(ctx context.Context) (uint64, bool)) (uint64, error) {
	var rev uint64
	tried := false
	err := Retry(ctx, func(ctx context.Context) (err error) {
		if tried {
			if r, ok := stored(ctx); ok {
				rev = r
				return nil
			}
		}
		tried = true
		if prevRev == 0 {
			rev, err = kv.Create(ctx, key, value)
		} else {
			rev, err = kv.Update(ctx, key, value, prevRev)
		}
		return err
	})
	return rev, err
}

// Changed reports whether a write's err says another change came first: the
// key was created, or changed since the revision the write was made from.
func Changed(err error) bool {
	return errors.Is(err, jetstream.ErrKeyExists) || err != nil && strings.Contains(err.Error(), "wrong last sequence")
}

// Buckets an operator's command asks the workers about.
const (
	Pauses   = "pauses"
	Policies = "policies"
)

// AppliedRequest asks every worker to confirm that its copy of Bucket
// (Pauses or Policies) has applied Revision, and, for the pause filed under
// AuditID, how many running attempts it cancelled.
type AppliedRequest struct {
	V        int    `json:"v"`
	Bucket   string `json:"bucket"`
	Revision uint64 `json:"revision"`
	AuditID  string `json:"auditId,omitempty"`
}

// AppliedReply is one worker's confirmation.
type AppliedReply struct {
	V int `json:"v"`
	// Worker is the worker's id.
	Worker string `json:"worker"`
	// Revision is the newest revision of the bucket its copy has applied;
	// Applied says whether it reached the one asked for, within the
	// worker's wait.
	Revision uint64 `json:"revision"`
	Applied  bool   `json:"applied"`
	// Pauses is how many pauses its copy holds; Cancelled how many running
	// attempts it cancelled for the pause asked about.
	Pauses    int `json:"pauses"`
	Cancelled int `json:"cancelled,omitempty"`
	// PolicyVersion is the Cedar policy set it evaluates (0: none), and
	// PolicyError why that version is broken, if it is.
	PolicyVersion int    `json:"policyVersion"`
	PolicyError   string `json:"policyError,omitempty"`
}

// AnswerWithin bounds a worker's answer to an AppliedRequest: it answers
// once its copy has the revision asked for, and, not applied yet, once
// AnswerWithin has passed.
const AnswerWithin = 2 * time.Second

// ConfirmWithin is how long Confirm gathers answers at most: AnswerWithin,
// and the way of a request and its answer through a cluster's routes.
const ConfirmWithin = AnswerWithin + 500*time.Millisecond

// Confirm asks every worker of the deployment to confirm that it applied
// revision rev of bucket (and the cancellations of the pause filed under
// auditID), and gathers their answers for wait, or ConfirmWithin when that
// is shorter: as long as every worker takes to answer, so that a worker slow
// to apply the change is listed as not having applied it, never left out
// (the workers are not counted anywhere, so no answer says they all have).
// No worker answering is no error: the change is in the bucket, and every
// worker applies it as it starts.
func Confirm(ctx context.Context, nc *nats.Conn, n broker.Names, bucket string, rev uint64, auditID string, wait time.Duration) ([]AppliedReply, error) {
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	b, err := envelope.Marshal(&AppliedRequest{V: envelope.Version, Bucket: bucket, Revision: rev, AuditID: auditID})
	if err != nil {
		return nil, err
	}
	if err := nc.PublishRequest(n.AppliedSubject(), inbox, b); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(min(wait, ConfirmWithin))
	var out []AppliedReply
	for {
		left := time.Until(deadline)
		if left <= 0 || ctx.Err() != nil {
			break
		}
		m, err := sub.NextMsg(left)
		if errors.Is(err, nats.ErrTimeout) {
			break
		}
		if err != nil {
			return out, err
		}
		var r AppliedReply
		if envelope.Unmarshal(m.Data, &r) == nil {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b AppliedReply) int { return strings.Compare(a.Worker, b.Worker) })
	return out, nil
}
