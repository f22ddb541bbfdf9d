package audit

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"

	"golang.org/x/mod/sumdb/tlog"

	"github.com/capstan-dev/capstan/internal/trail"
)

// envelopeHashKey is the field of an execution's terminal event that holds
// the hex SHA-256 of its envelope as stored (DESIGN §8, "The trail as a
// log").
const envelopeHashKey = "envelopeHash"

// TrailProof is an execution's trail with the evidence that it is in the
// deployment's audit log, unchanged: a signed checkpoint of the log, and,
// for each stored message of the trail, its place in the log and the
// RFC 6962 inclusion proof of it in the checkpoint's tree (docs/wire.md,
// "Proofs"). Anyone with the deployment's public key checks it with
// Verify, without access to the deployment.
type TrailProof struct {
	// Checkpoint is the signed checkpoint (a C2SP tlog-checkpoint note).
	Checkpoint string `json:"checkpoint"`
	// Messages are the trail's stored messages, oldest first.
	Messages []ProvedMessage `json:"messages"`
	// Envelope is the execution's envelope as the envelopes bucket stores
	// it, while it is kept: its SHA-256 is what the terminal event commits
	// to.
	Envelope []byte `json:"envelope,omitempty"`
}

// ProvedMessage is one stored audit message of a trail and the proof that
// it is leaf Leaf of the checkpoint's tree.
type ProvedMessage struct {
	// Seq is the message's sequence in the audit stream.
	Seq uint64 `json:"seq"`
	// Leaf is its index in the log: Seq less the checkpoint's first
	// sequence.
	Leaf int64 `json:"leaf"`
	// Subject is the message's subject as stored; with Header and Data, what
	// its leaf hashes.
	Subject string `json:"subject"`
	// Header holds the headers it was stored with (Capstan-Execution).
	Header map[string][]string `json:"header,omitempty"`
	// Data is the message's bytes as stored: one event, or several of one
	// execution.
	Data []byte `json:"data"`
	// Proof is the inclusion proof: the sibling hashes from the leaf up,
	// base64.
	Proof []string `json:"proof"`
	// Events are the message's events, decoded from Data.
	Events []Event `json:"events"`
}

// Verify checks the proof against publicKeys, the deployment's verifier
// keys one a line (its audit.pub): the checkpoint's signature, each
// message's inclusion in the checkpoint's tree at its place, that its events
// are the ones it holds, all of one execution, and, when the proof carries
// the envelope and an event commits to one, that its hash is one committed
// to.
func (p *TrailProof) Verify(publicKeys string) error {
	keys, _, err := trail.ParseVerifiers(publicKeys)
	if err != nil {
		return fmt.Errorf("capstan: public keys: %w", err)
	}
	cp, err := trail.Open([]byte(p.Checkpoint), keys)
	if err != nil {
		return fmt.Errorf("capstan: %w", err)
	}
	if len(p.Messages) == 0 {
		return errors.New("capstan: the proof holds no message")
	}
	// Two runs of one execution (a read run again while it still ran, a
	// worker stalled past its lease) each file a terminal event; the
	// envelope that stands is the one of them whose create came first.
	key, committed := "", map[string]bool{}
	for _, m := range p.Messages {
		in := trail.Inclusion{Msg: &trail.Msg{Seq: m.Seq, Subject: m.Subject, Header: m.Header, Data: m.Data}, Leaf: m.Leaf}
		for _, s := range m.Proof {
			b, err := base64.StdEncoding.DecodeString(s)
			if err != nil || len(b) != tlog.HashSize {
				return fmt.Errorf("capstan: sequence %d: a proof hash that is not one", m.Seq)
			}
			in.Hashes = append(in.Hashes, tlog.Hash(b))
		}
		if err := in.Check(cp); err != nil {
			return fmt.Errorf("capstan: %w", err)
		}
		evs, err := Decode(m.Data)
		if err != nil {
			return err
		}
		if len(evs) != len(m.Events) {
			return fmt.Errorf("capstan: sequence %d holds %d events, the proof shows %d", m.Seq, len(evs), len(m.Events))
		}
		for i := range evs {
			if k := evs[i].Key(); key == "" {
				key = k
			} else if k != key {
				return fmt.Errorf("capstan: sequence %d holds an event of %s, not %s", m.Seq, k, key)
			}
			// As JSON, which a proof read from a file was: the same text
			// for the same event however it travelled.
			want, _ := json.Marshal(&evs[i])
			if got, _ := json.Marshal(&m.Events[i]); !bytes.Equal(got, want) {
				return fmt.Errorf("capstan: sequence %d: event %d is not the one the message holds", m.Seq, i)
			}
			if h, ok := evs[i].Data[envelopeHashKey].(string); ok {
				committed[h] = true
			}
		}
	}
	if p.Envelope != nil && len(committed) > 0 {
		sum := sha256.Sum256(p.Envelope)
		if !committed[hex.EncodeToString(sum[:])] {
			return errors.New("capstan: the envelope is not the one the trail commits to")
		}
	}
	return nil
}
