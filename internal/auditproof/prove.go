// Package auditproof proves an execution's trail in the deployment's audit
// log: what executor.Client.ProveTrail, the console and `capstan audit prove`
// return, and audit.TrailProof.Verify checks.
package auditproof

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/trail"
)

// Prove reads principal's execution executionID's trail and proves each of
// its messages in the deployment's latest checkpoint, with the envelope
// while it is kept. The checkpointer signs about every second: while the
// latest checkpoint does not cover the trail's last message yet, Prove
// waits for one that does, until ctx ends. It needs a connection that may
// read the audit stream and the trail's bucket (an admin's, a worker's, an
// open server's).
func Prove(ctx context.Context, b *broker.Broker, principal, executionID string) (*audit.TrailProof, error) {
	events, err := audit.Read(ctx, b.NC, b.Names.Prefix(), principal, executionID)
	if err != nil {
		return nil, err
	}
	var seqs []uint64
	for _, ev := range events {
		if !slices.Contains(seqs, ev.Seq) {
			seqs = append(seqs, ev.Seq)
		}
	}
	signed, incs, err := trail.Prove(ctx, b, seqs)
	if err != nil {
		return nil, fmt.Errorf("capstan: prove the trail: %w", err)
	}
	p := &audit.TrailProof{Checkpoint: string(signed)}
	for _, in := range incs {
		pm := audit.ProvedMessage{Seq: in.Msg.Seq, Leaf: in.Leaf, Subject: in.Msg.Subject, Header: in.Msg.Header, Data: in.Msg.Data}
		for _, h := range in.Hashes {
			pm.Proof = append(pm.Proof, base64.StdEncoding.EncodeToString(h[:]))
		}
		if pm.Events, err = audit.Decode(in.Msg.Data); err != nil {
			return nil, err
		}
		for i := range pm.Events {
			pm.Events[i].Seq = in.Msg.Seq
		}
		p.Messages = append(p.Messages, pm)
	}
	if b.Envelopes != nil {
		e, err := b.Envelopes.Get(ctx, broker.Key(principal, executionID))
		switch {
		case err == nil:
			p.Envelope = e.Value()
		case !errors.Is(err, jetstream.ErrKeyNotFound) && !errors.Is(err, jetstream.ErrKeyDeleted):
			return nil, err
		}
	}
	return p, nil
}
