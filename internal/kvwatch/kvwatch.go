// Package kvwatch follows a key-value bucket into memory: the grants, the
// catalog and the approvals index each keep what their bucket holds, and
// each must know when what the bucket held at the start is in.
package kvwatch

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/internal/jsget"
)

// Follow hands every update of w to apply, in order, in a goroutine of its
// own until w stops. initial tells apply whether the entry is one of the
// values the bucket held when the watch began; the channel Follow returns
// closes once those are applied (or w stopped before them).
func Follow(w jetstream.KeyWatcher, apply func(e jetstream.KeyValueEntry, initial bool)) <-chan struct{} {
	return FollowThen(w, apply, nil)
}

// FollowThen is Follow, calling ended (when set) once w has stopped and
// every update is applied.
func FollowThen(w jetstream.KeyWatcher, apply func(e jetstream.KeyValueEntry, initial bool), ended func()) <-chan struct{} {
	loaded := make(chan struct{})
	go func() {
		initial := true
		for e := range w.Updates() {
			if e == nil {
				if initial {
					initial = false
					close(loaded)
				}
				continue
			}
			apply(e, initial)
		}
		if initial {
			close(loaded)
		}
		if ended != nil {
			ended()
		}
	}()
	return loaded
}

// Republished names the streams (in brackets) whose RePublish or direct get
// stored revision rev of bucket; Superseded when the revision is gone (a
// later one follows); "" when a client put it. The server adds Nats-Stream to every
// message it republishes or answers a direct get with, and no put carries
// it. The buckets only admins write take no such message: a principal that
// may create streams or send requests in their account (a worker) could
// otherwise write them so, past the permissions that keep it off the
// buckets' subjects.
func Republished(ctx context.Context, nc *nats.Conn, bucket string, rev uint64) (string, error) {
	return republished(ctx, nc, bucket, jsget.Request{Seq: rev})
}

// Superseded is what Republished says of a revision no longer stored.
const Superseded = "(superseded)"

// LastRepublished is Republished of key's last message, with that
// message's sequence: a key-value read may not say its revision rightly,
// since a republished message's headers stand where that read takes it
// from.
func LastRepublished(ctx context.Context, nc *nats.Conn, bucket, key string) (from string, seq uint64, err error) {
	m, err := jsget.Get(ctx, nc, "KV_"+bucket, jsget.Request{LastFor: "$KV." + bucket + "." + key})
	if errors.Is(err, jsget.ErrNoMessage) {
		return "", 0, nil
	}
	if err != nil {
		return "", 0, err
	}
	return streamsOf(m), m.Sequence, nil
}

func republished(ctx context.Context, nc *nats.Conn, bucket string, req jsget.Request) (string, error) {
	m, err := jsget.Get(ctx, nc, "KV_"+bucket, req)
	if errors.Is(err, jsget.ErrNoMessage) {
		// Gone: a later change of the key took its place, and is read in
		// turn. What it was cannot be told, so it is not honoured.
		return Superseded, nil
	}
	if err != nil {
		return "", err
	}
	return streamsOf(m), nil
}

// streamsOf names the streams a stored message's Nats-Stream headers name,
// in brackets; "" when it has none.
func streamsOf(m *jetstream.RawStreamMsg) string {
	// The header at all, whatever its first value: the server adds its own
	// after those of the message it republishes, which may hold an empty one.
	from := m.Header.Values(jetstream.StreamHeader)
	if len(from) == 0 {
		return ""
	}
	return "[" + strings.Join(from, ",") + "]"
}

// Forged is Republished for entry e of bucket, read within 5 s: the stream
// that wrote it, or "" for an entry a client put. A read that fails says
// "" (what the entry is cannot be told) and returns its error.
func Forged(ctx context.Context, nc *nats.Conn, bucket string, e jetstream.KeyValueEntry) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return Republished(ctx, nc, bucket, e.Revision())
}
