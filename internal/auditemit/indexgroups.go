package auditemit

import (
	"bytes"
	"slices"
	"sync"
	"time"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/msgenc"
)

// The executions index's entries, coalesced (DESIGN §3, "Listing
// executions"). Every execution's end makes an entry; a message of its own
// for each cost the write path one server message per execution. Ends that
// come close together on one subject — one principal's executions of one
// capability, for the actors of one shard, ending the same way — go as one
// message instead: an end waits at most indexLinger for others of its
// subject, and a message holds at most indexGroupEntries of them (or
// indexGroupBytes). Under load that is one message per hundreds of
// executions; at a trickle, one per execution, as before. A quarter of a second
// is as late as a listing shows an execution, and what a killed worker
// takes with it.
//
// A listing shows an execution by its newest entry, so an execution's
// entries must be stored in the order they happened. An end and a running
// entry wait: the end of an execution whose running entry still waits
// replaces it (this emitter wrote both; another worker writes the end only
// after taking the execution over, a lease later). An approval-required
// entry goes at once (another worker may end the execution it resumes as
// soon as a person decides), after everything that waits, which happened
// before it, but its execution's running entry, which it replaces; so does
// a queued one (a pause's hold: the execution is given back, and any worker
// may take it and end it at its next delivery), after that running entry
// alone.
const (
	indexLinger       = 250 * time.Millisecond
	indexGroupEntries = 1024
	indexGroupBytes   = 256 << 10
)

// waits reports whether an entry of status may wait for others.
func waits(status string) bool {
	return status != audit.EntryApprovalRequired && status != audit.EntryQueued
}

// indexGroup is one message of the index being made: entries of one subject,
// oldest first.
type indexGroup struct {
	subject string
	buf     *[]byte // room for the array's header, then the entries' encodings
	n       int
	key     string // the first entry's execution (broker.Key), for the log
}

// headerRoom is what a group's buffer keeps in front of its entries for the
// array's header (at most indexGroupEntries: three bytes).
const headerRoom = 3

// groupBufs keep the groups' buffers between messages: a publish copies the
// data it sends.
var groupBufs = sync.Pool{New: func() any {
	b := make([]byte, headerRoom, 16<<10)
	return &b
}}

func newGroup(subject, key string) *indexGroup {
	b := groupBufs.Get().(*[]byte)
	*b = (*b)[:headerRoom]
	return &indexGroup{subject: subject, key: key, buf: b}
}

// entries is how many bytes the entries take.
func (g *indexGroup) size() int { return len(*g.buf) - headerRoom }

func (g *indexGroup) join(entry []byte) {
	*g.buf = append(*g.buf, entry...)
	g.n++
}

// payload is the message's data: the entry alone, or the entries as an
// array (audit.List reads both). It is g's buffer: valid until release.
func (g *indexGroup) payload() []byte {
	b := *g.buf
	switch {
	case g.n == 1:
		return b[headerRoom:]
	case g.n < 16:
		b[headerRoom-1] = 0x90 | byte(g.n)
		return b[headerRoom-1:]
	}
	b[0], b[1], b[2] = 0xdc, byte(g.n>>8), byte(g.n)
	return b
}

// release hands g's buffer back, once its message is sent.
func (g *indexGroup) release() {
	if cap(*g.buf) <= 2*indexGroupBytes {
		groupBufs.Put(g.buf)
	}
	g.buf = nil
}

// groupKey names a subject of the index by the tokens it is made of, so that
// adding an entry to an open group builds no subject.
type groupKey struct{ principal, status, shard, capability string }

// indexGroups holds the open groups until they are full or indexLinger has
// passed since the first entry of any of them; send publishes one, and
// releases it.
type indexGroups struct {
	names  broker.Names
	send   func(*indexGroup)
	linger time.Duration // indexLinger; tests change it

	// sending is held while messages are sent: an entry that goes at once
	// goes after what a flush took, and a flush returns after what the
	// timer's flush took is sent.
	sending sync.Mutex

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
func subjectTokens(e *audit.Entry) groupKey {
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
func (gs *indexGroups) add(e *audit.Entry) error {
	enc, err := msgenc.Encode(e)
	if err != nil {
		return err
	}
	defer enc.Release()
	k := subjectTokens(e)
	if !waits(e.Status) {
		// After everything that waits, which happened before it, but the
		// execution's own running entry, which it replaces; after what a
		// flush took, which holds sending until it is sent. A queued entry
		// goes after its own execution's alone (nothing of it waits but
		// its running entry: an execution held has not ended), so that a
		// pause leaves the others' grouping as it is.
		gs.sending.Lock()
		defer gs.sending.Unlock()
		gs.mu.Lock()
		gs.replaced(e)
		gs.mu.Unlock()
		if e.Status != audit.EntryQueued {
			gs.flushSending()
		}
		g := newGroup(gs.subject(k), broker.Key(e.Principal, e.ExecutionID))
		g.join(enc.Bytes())
		gs.send(g)
		return nil
	}
	gs.mu.Lock()
	var full *indexGroup
	if e.Status == audit.EntryRunning {
		gs.running[broker.Key(e.Principal, e.ExecutionID)] = waiting{k: k, principal: e.Principal, executionID: e.ExecutionID,
			data: bytes.Clone(enc.Bytes())}
	} else {
		gs.replaced(e)
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
		gs.sending.Lock()
		gs.send(full)
		gs.sending.Unlock()
	}
	return nil
}

// replaced forgets the running entry of e's execution that still waits:
// e, later, replaces it. Called with mu held.
func (gs *indexGroups) replaced(e *audit.Entry) {
	if len(gs.running) > 0 {
		delete(gs.running, broker.Key(e.Principal, e.ExecutionID))
	}
}

// join adds an entry's encoding to the open group of its subject, and
// returns the group when that makes it full: it is closed, for the caller to
// send. Called with mu held.
func (gs *indexGroups) join(k groupKey, principal, executionID string, data []byte) *indexGroup {
	g := gs.open[k]
	if g == nil {
		g = newGroup(gs.subject(k), broker.Key(principal, executionID))
		gs.open[k] = g
		gs.order = append(gs.order, k)
	}
	g.join(data)
	if g.n < indexGroupEntries && g.size() < indexGroupBytes {
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
// It returns once they are sent, and once what another flush was sending is.
func (gs *indexGroups) flush() {
	gs.sending.Lock()
	defer gs.sending.Unlock()
	gs.flushSending()
}

// flushSending is flush with sending held.
func (gs *indexGroups) flushSending() {
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
