package audit

import (
	"bytes"
	"slices"
	"sync"
	"time"

	"github.com/capstan-dev/capstan/broker"
	"github.com/capstan-dev/capstan/envelope"
)

// The executions index's entries, coalesced (DESIGN §3, "Listing
// executions"). Every execution's end makes an entry; a message of its own
// for each cost the write path one server message per execution. Ends that
// come close together on one subject — one principal's executions of one
// capability, for the actors of one shard, ending the same way — go as one
// message instead: an end waits at most indexLinger for others of its
// subject, and a message holds at most indexGroupEntries of them (or
// indexGroupBytes). Under load that is one message per hundreds of
// executions; at a trickle, one per execution, as before.
//
// A listing shows an execution by its newest entry, so an execution's
// entries must be stored in the order they happened. An end and a running
// entry wait: the end of an execution whose running entry still waits
// replaces it (this emitter wrote both; another worker writes the end only
// after taking the execution over, a lease later). An approval-required
// entry goes at once: another worker may end the execution it resumes as
// soon as a person decides.
const (
	indexLinger       = 100 * time.Millisecond
	indexGroupEntries = 256
	indexGroupBytes   = 64 << 10
)

// waits reports whether an entry of status may wait for others.
func waits(status string) bool {
	return status != EntryApprovalRequired
}

// indexGroup is one message of the index being made: entries of one subject,
// oldest first.
type indexGroup struct {
	subject string
	data    []byte // the entries' encodings, one after the other
	n       int
	key     string // the first entry's execution (broker.Key), for the log
}

// payload is the message's data: the entry alone, or the entries as an
// array (DecodeEntries).
func (g *indexGroup) payload() []byte {
	if g.n == 1 {
		return g.data
	}
	var h []byte
	switch {
	case g.n < 16:
		h = []byte{0x90 | byte(g.n)}
	default: // at most indexGroupEntries
		h = []byte{0xdc, byte(g.n >> 8), byte(g.n)}
	}
	return append(h, g.data...)
}

// groupKey names a subject of the index by the tokens it is made of, so that
// adding an entry to an open group builds no subject.
type groupKey struct{ principal, status, shard, capability string }

// indexGroups holds the open groups until they are full or indexLinger has
// passed since the first entry of any of them; send publishes one.
type indexGroups struct {
	names  broker.Names
	send   func(*indexGroup)
	linger time.Duration // indexLinger; tests change it

	mu    sync.Mutex
	open  map[groupKey]*indexGroup
	order []groupKey // the open groups by their first entry: they go in this order
	// running are the running entries waiting, by execution (broker.Key):
	// they join their groups when these go, unless the execution's end
	// comes first.
	running map[string]waiting
	timer   *time.Timer
	armed   bool
}

// waiting is a running entry that waits.
type waiting struct {
	k                      groupKey
	principal, executionID string
	data                   []byte
}

func newIndexGroups(names broker.Names, send func(*indexGroup)) *indexGroups {
	return &indexGroups{names: names, send: send, linger: indexLinger, open: map[groupKey]*indexGroup{}, running: map[string]waiting{}}
}

// subjectTokens are the tokens of e's subject: a principal or a capability
// id that is no subject token (a request refused for it) is filed under the
// anonymous principal, or "_invalid".
func subjectTokens(e *Entry) groupKey {
	k := groupKey{principal: e.Principal, status: e.Status, shard: broker.IndexActorShard(e.Actor.ID), capability: e.CapabilityID}
	if envelope.ValidCapabilityID(k.capability) != nil {
		k.capability = "_invalid"
	}
	if !broker.ValidPrincipal(k.principal) {
		k.principal = broker.Anonymous
	}
	return k
}

// add files e: at once when it does not wait, else into its subject's open
// group, which goes when full.
func (gs *indexGroups) add(e *Entry) error {
	enc, err := envelope.Encode(e)
	if err != nil {
		return err
	}
	defer enc.Release()
	k := subjectTokens(e)
	if !waits(e.Status) {
		gs.send(&indexGroup{subject: gs.subject(k), data: enc.Bytes(), n: 1, key: broker.Key(e.Principal, e.ExecutionID)})
		return nil
	}
	gs.mu.Lock()
	var full *indexGroup
	if e.Status == EntryRunning {
		gs.running[broker.Key(e.Principal, e.ExecutionID)] = waiting{k: k, principal: e.Principal, executionID: e.ExecutionID,
			data: bytes.Clone(enc.Bytes())}
	} else {
		if len(gs.running) > 0 {
			delete(gs.running, broker.Key(e.Principal, e.ExecutionID)) // its end replaces it
		}
		full = gs.join(k, e.Principal, e.ExecutionID, enc.Bytes())
	}
	if !gs.armed && (len(gs.open) > 0 || len(gs.running) > 0) {
		gs.armed = true
		if gs.timer == nil {
			gs.timer = time.AfterFunc(gs.linger, gs.flush)
		} else {
			gs.timer.Reset(gs.linger)
		}
	}
	gs.mu.Unlock()
	if full != nil {
		gs.send(full)
	}
	return nil
}

// join adds an entry's encoding to the open group of its subject, and
// returns the group when that makes it full: it is closed, for the caller to
// send. Called with mu held.
func (gs *indexGroups) join(k groupKey, principal, executionID string, data []byte) *indexGroup {
	g := gs.open[k]
	if g == nil {
		g = &indexGroup{subject: gs.subject(k), key: broker.Key(principal, executionID)}
		gs.open[k] = g
		gs.order = append(gs.order, k)
	}
	g.data = append(g.data, data...)
	g.n++
	if g.n < indexGroupEntries && len(g.data) < indexGroupBytes {
		return nil
	}
	delete(gs.open, k)
	gs.order = slices.DeleteFunc(gs.order, func(o groupKey) bool { return o == k })
	return g
}

func (gs *indexGroups) subject(k groupKey) string {
	return gs.names.IndexSubjectOfShard(k.principal, k.status, k.shard, k.capability)
}

// flush publishes every open group, the waiting running entries with them.
func (gs *indexGroups) flush() {
	gs.mu.Lock()
	if len(gs.open) == 0 && len(gs.running) == 0 {
		gs.armed = false
		gs.mu.Unlock()
		return
	}
	groups := make([]*indexGroup, 0, len(gs.open)+1)
	for _, w := range gs.running {
		if g := gs.join(w.k, w.principal, w.executionID, w.data); g != nil {
			groups = append(groups, g)
		}
	}
	clear(gs.running)
	for _, k := range gs.order {
		groups = append(groups, gs.open[k])
	}
	clear(gs.open)
	gs.order = gs.order[:0]
	gs.armed = false
	gs.timer.Stop()
	gs.mu.Unlock()
	for _, g := range groups {
		gs.send(g)
	}
}
