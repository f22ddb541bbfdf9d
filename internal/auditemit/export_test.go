package auditemit

import (
	"time"

	"github.com/capstan-dev/capstan/audit"
)

// SetIndexLinger changes how long e's index entries wait for others; call it
// before e emits.
func SetIndexLinger(e *Emitter, d time.Duration) { e.groups.linger = d }

// WrapIndexSend makes e's messages of the index go through wrap, which is
// given each one's subject and the send to call.
func WrapIndexSend(e *Emitter, wrap func(subject string, send func())) {
	send := e.groups.send
	e.groups.send = func(g *indexGroup) { wrap(g.subject, func() { send(g) }) }
}

// EntryOf is the index entry of one audit message's events (entryOf).
func EntryOf(evs []*audit.Event) *audit.Entry { return entryOf(evs) }
