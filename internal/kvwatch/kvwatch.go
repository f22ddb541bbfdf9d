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

// Forged names the streams (in brackets) whose RePublish or direct get
// stored entry e of bucket, read within 5 s; superseded when its revision is
// gone because a later change of the key took its place (read in turn: what
// the gone one was cannot be told, so it is not honoured); "" when a client
// put it, or when what it was cannot be told otherwise (on a cluster a get
// can find no newest revision: a worker must not stay on an older change).
// The server adds Nats-Stream to every message it republishes or answers a
// direct get with, and no put carries it. The buckets only admins write take
// no such message: a principal that may create streams or send requests in
// their account (a worker) could otherwise write them so, past the
// permissions that keep it off the buckets' subjects. A read that fails
// says "" and returns its error.
func Forged(ctx context.Context, nc *nats.Conn, bucket string, e jetstream.KeyValueEntry) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	m, err := stored(ctx, nc, bucket, jsget.Request{Seq: e.Revision()})
	if err != nil {
		return "", err
	}
	if m != nil {
		return storedBy(m), nil
	}
	from, last, err := LastRepublished(ctx, nc, bucket, e.Key())
	switch {
	case err != nil || last < e.Revision():
		return "", err // none, or earlier: what it was cannot be told
	case last > e.Revision():
		return superseded, nil
	}
	return from, nil
}

// superseded is what Forged says of a revision a later one took the place of.
const superseded = "(superseded)"

// LastRepublished is Forged of key's last message, with that message's
// sequence: a key-value read may not say its revision rightly, since a
// republished message's headers stand where that read takes it from.
func LastRepublished(ctx context.Context, nc *nats.Conn, bucket, key string) (from string, seq uint64, err error) {
	m, err := stored(ctx, nc, bucket, jsget.Request{LastFor: "$KV." + bucket + "." + key})
	if m == nil || err != nil {
		return "", 0, err
	}
	return storedBy(m), m.Sequence, nil
}

// stored reads bucket's message req names, as the stream stores it; nil
// when there is none.
func stored(ctx context.Context, nc *nats.Conn, bucket string, req jsget.Request) (*jetstream.RawStreamMsg, error) {
	m, err := jsget.Get(ctx, nc, "KV_"+bucket, req)
	if errors.Is(err, jsget.ErrNoMessage) {
		return nil, nil
	}
	return m, err
}

// storedBy names the streams a stored message's Nats-Stream headers name,
// in brackets; "" when it has none.
func storedBy(m *jetstream.RawStreamMsg) string {
	// The header at all, whatever its first value: the server adds its own
	// after those of the message it republishes, which may hold an empty one.
	from := m.Header.Values(jetstream.StreamHeader)
	if len(from) == 0 {
		return ""
	}
	return "[" + strings.Join(from, ",") + "]"
}
