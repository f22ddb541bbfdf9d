// Package kvwatch follows a key-value bucket into memory: the grants, the
// catalog and the approvals index each keep what their bucket holds, and
// each must know when what the bucket held at the start is in.
package kvwatch

import "github.com/nats-io/nats.go/jetstream"

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
