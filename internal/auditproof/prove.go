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
	"time"

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
// open server's). Of an execution that ended, the worker files the
// terminal event just after the envelope: Prove waits for it too, at most
// terminalWait, and then proves what is filed. The proof is against the
// latest checkpoint publicKeys verify (audit.pub's text; "": the keys the
// deployment states; when they verify none, the latest stored), so that
// what a worker's stream can file in the checkpoints stream stands in no
// proof's way.
func Prove(ctx context.Context, b *broker.Broker, principal, executionID, publicKeys string) (*audit.TrailProof, error) {
	var stored []byte
	if b.Envelopes != nil {
		// Read where absence decides: a replica behind would leave the
		// proof without its envelope, and the terminal event unwaited for.
		var err error
		if stored, _, err = broker.GetCurrent(ctx, b, b.Envelopes, broker.Key(principal, executionID)); err != nil && !errors.Is(err, broker.ErrNotFound) {
			return nil, err
		}
	}
	events, err := readTrail(ctx, b, principal, executionID, stored != nil)
	if err != nil {
		return nil, err
	}
	var seqs []uint64
	for _, ev := range events {
		if !slices.Contains(seqs, ev.Seq) {
			seqs = append(seqs, ev.Seq)
		}
	}
	if publicKeys == "" {
		publicKeys, _ = trail.StatedKeys(ctx, b)
	}
	keys, _, err := trail.ParseVerifiers(publicKeys)
	if err != nil {
		keys = nil // none to choose with: the latest stored
	}
	signed, incs, err := trail.Prove(ctx, b, seqs, keys)
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
	p.Envelope = stored
	return p, nil
}

// terminalWait bounds how long Prove waits for an ended execution's
// terminal event: the worker files it within milliseconds of the envelope;
// one whose trail could not be written (the audit stream full or out of
// reach) never files it.
const terminalWait = 10 * time.Second

// readTrail reads the trail; of an execution that ended, once it holds the
// terminal event, or terminalWait passed.
func readTrail(ctx context.Context, b *broker.Broker, principal, executionID string, ended bool) ([]audit.Event, error) {
	wait, cancel := context.WithTimeout(ctx, terminalWait)
	defer cancel()
	for try := 0; ; try++ {
		events, err := audit.Read(ctx, b.NC, b.Names.Prefix(), principal, executionID)
		if !ended || (err == nil && slices.ContainsFunc(events, terminal)) || (err != nil && !errors.Is(err, broker.ErrNotFound)) {
			return events, err
		}
		select {
		case <-wait.Done():
			return events, err
		case <-time.After(broker.Backoff(try)):
		}
	}
}

// terminal reports whether ev ends its execution's trail, committing to the
// envelope (executor's engine.EnvelopeHashKey).
func terminal(ev audit.Event) bool {
	_, ok := ev.Data["envelopeHash"]
	return ok
}
