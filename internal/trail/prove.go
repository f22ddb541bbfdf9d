package trail

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

// Inclusion is one message with the proof that it is leaf Leaf of a
// checkpoint's tree (RFC 6962's audit path, nearest sibling first).
type Inclusion struct {
	Msg    *Msg
	Leaf   int64
	Hashes tlog.RecordProof
}

// Check verifies the inclusion against cp, a checkpoint whose signature
// was checked.
func (in *Inclusion) Check(cp *Checkpoint) error {
	if want := int64(in.Msg.Seq) - int64(cp.FirstSeq); want != in.Leaf {
		return fmt.Errorf("sequence %d is leaf %d of the log, not %d", in.Msg.Seq, want, in.Leaf)
	}
	if err := tlog.CheckRecord(in.Hashes, cp.Size, cp.Root, in.Leaf, in.Msg.Leaf()); err != nil {
		return fmt.Errorf("sequence %d (leaf %d) is not in the checkpoint of size %d: %w", in.Msg.Seq, in.Leaf, cp.Size, err)
	}
	return nil
}

// ErrNotCovered is returned while the latest checkpoint does not cover a
// message yet (the checkpointer signs about every second).
var ErrNotCovered = errors.New("not yet covered by a checkpoint")

// Prove reads the messages at seqs and proves each in the latest
// checkpoint that keys verify (nil, or when they verify none: that reads as
// one), which it returns as stored: a checkpoint nobody signed, or an older
// one filed again, that a worker's stream can file after it stands in no
// proof's way. While no
// checkpoint covers them all it waits for a later one until ctx ends, then
// fails with ErrNotCovered.
func Prove(ctx context.Context, b *broker.Broker, seqs []uint64, keys note.Verifiers) ([]byte, []Inclusion, error) {
	trail, cps, err := bind(ctx, b)
	if err != nil {
		return nil, nil, err
	}
	var want uint64
	for _, s := range seqs {
		want = max(want, s)
	}
	var signed []byte
	var cp *Checkpoint
	for {
		signed, err = lastCheckpoint(ctx, b, keys, want)
		if err == nil {
			cp, err = OpenUnverified(signed)
		}
		if err == nil && cp.FirstSeq+uint64(cp.Size) > want {
			break
		}
		if err == nil {
			err = fmt.Errorf("sequence %d: %w (the latest has %d leaves, up to sequence %d)", want, ErrNotCovered, cp.Size, cp.FirstSeq+uint64(cp.Size)-1)
		}
		if !errors.Is(err, ErrNotCovered) && !errors.Is(err, ErrNoLog) {
			return nil, nil, err
		}
		select {
		case <-ctx.Done():
			return nil, nil, err
		case <-time.After(200 * time.Millisecond):
		}
	}
	hr := tlog.TileHashReader(cp.Tree(), newTileReader(ctx, &deployment{b: &broker.Broker{Trail: trail, Checkpoints: cps, Audit: b.Audit}}))
	out := make([]Inclusion, 0, len(seqs))
	for _, s := range seqs {
		if s < cp.FirstSeq {
			return nil, nil, fmt.Errorf("sequence %d is before the log began (sequence %d)", s, cp.FirstSeq)
		}
		m, err := getMsg(ctx, b.NC, b.Names.AuditStream(), s)
		if err != nil {
			return nil, nil, fmt.Errorf("read sequence %d: %w", s, err)
		}
		leaf := int64(s - cp.FirstSeq)
		p, err := tlog.ProveRecord(cp.Size, leaf, hr)
		if err != nil {
			return nil, nil, fmt.Errorf("prove sequence %d: the stored tiles do not match the latest checkpoint: %w", s, err)
		}
		out = append(out, Inclusion{Msg: m, Leaf: leaf, Hashes: p})
	}
	return signed, out, nil
}

// bind returns the trail bucket and the checkpoints stream of b, bound now
// when b was opened without them.
func bind(ctx context.Context, b *broker.Broker) (jetstream.KeyValue, jetstream.Stream, error) {
	trail, cps := b.Trail, b.Checkpoints
	var err error
	if trail == nil {
		if trail, err = b.JS.KeyValue(ctx, b.Names.TrailBucket()); err != nil {
			if errors.Is(err, jetstream.ErrBucketNotFound) {
				return nil, nil, ErrNoLog
			}
			return nil, nil, err
		}
	}
	if cps == nil {
		if cps, err = b.JS.Stream(ctx, b.Names.CheckpointStream()); err != nil {
			if errors.Is(err, jetstream.ErrStreamNotFound) {
				return nil, nil, ErrNoLog
			}
			return nil, nil, err
		}
	}
	return trail, cps, nil
}

// Latest returns the latest stored checkpoint of b's deployment that keys
// verify (nil, or when they verify none: that reads as one), signed.
func Latest(ctx context.Context, b *broker.Broker, keys note.Verifiers) ([]byte, error) {
	_, _, err := bind(ctx, b)
	if err != nil {
		return nil, err
	}
	return lastCheckpoint(ctx, b, keys, 0)
}

// lastCheckpoint returns the last message of the checkpoints stream that
// keys verify as a checkpoint, passing over what no checkpointer files (see
// Checkpointer.lastSigned); past the first, for one that covers sequence
// want when it does not (an older checkpoint filed again): the largest of
// those read. When keys are nil, or verify none of those read, it is the
// last that reads as a checkpoint.
func lastCheckpoint(ctx context.Context, b *broker.Broker, keys note.Verifiers, want uint64) ([]byte, error) {
	last, err := getLastOf(ctx, b.NC, b.Names.CheckpointStream(), b.Names.CheckpointSubject())
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, ErrNoLog
	}
	if err != nil {
		return nil, err
	}
	if cp, err := OpenUnverified(last.Data); err == nil && (keys == nil || cp.FirstSeq+uint64(cp.Size) > want) {
		if keys == nil {
			return last.Data, nil
		}
		if _, err := Open(last.Data, keys); err == nil {
			return last.Data, nil
		}
	}
	var signed, parsed []byte // the largest read that keys verify, the last that reads as one
	var size int64
	read, err := scanBack(ctx, b, last.Sequence, keys, func(_ uint64, data []byte, cp *Checkpoint, ok bool) bool {
		if parsed == nil {
			parsed = data
		}
		if ok && (signed == nil || cp.Size > size) {
			signed, size = data, cp.Size
		}
		return keys != nil && (signed == nil || cp.FirstSeq+uint64(size) <= want)
	})
	switch {
	case err != nil:
		return nil, err
	case signed != nil:
		return signed, nil
	case parsed != nil:
		return parsed, nil
	case read >= maxSkipped:
		return nil, fmt.Errorf("the last %d messages of the checkpoints stream are no checkpoints (run 'capstan audit verify')", read)
	}
	return nil, ErrNoLog
}

// StatedKeys returns the verifier keys the deployment's checkpointers
// published: for a reader given no key of its own, who then trusts the
// deployment's word for which key is its.
func StatedKeys(ctx context.Context, b *broker.Broker) (string, error) {
	trail, _, err := bind(ctx, b)
	if err != nil {
		return "", err
	}
	e, err := trail.Get(ctx, keysKey)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return "", ErrNoLog
	}
	if err != nil {
		return "", err
	}
	return string(e.Value()), nil
}
