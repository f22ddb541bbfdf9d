package auditemit

import (
	"encoding/json"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// batcher publishes asynchronous events as one long JetStream fast batch
// ("fast ingest"): each message names the batch and its place in it in its
// reply subject, and the stream acknowledges every few hundred messages
// instead of each one. An event costs one message to the server instead of a
// publish and its acknowledgement.
//
// Nothing is left unconfirmed: the stream reports each message it refuses
// (and each one it never received, as a gap); a batch whose tail has waited
// for an acknowledgement for commitAfter is committed, and the commit's
// acknowledgement confirms the tail. A message neither confirmed nor refused
// within AckTimeout of its batch's commit is counted as not stored, as an
// asynchronous publish that timed out is.
type batcher struct {
	nc      *nats.Conn
	timeout time.Duration // the emitter's AckTimeout
	log     *slog.Logger
	what    string           // what a message holds, for the log: "audit event", "index entry"
	lost    func(events int) // counts what was not stored
	inbox   string           // replies arrive on inbox.<batch>.<flow>.ok.<seq>.<op>.$FI
	sub     *nats.Subscription

	mu        sync.Mutex
	cur       *openBatch            // the batch new events join; nil: start one
	committed map[string]*openBatch // committed, waiting for their acknowledgement
	pending   int                   // messages not yet confirmed, all batches
	room      chan struct{}         // closed and replaced when messages are confirmed
	idle      chan struct{}         // closed when nothing is pending
	timer     *time.Timer
	disabled  bool // the stream refused batches: publish one by one
}

type openBatch struct {
	id       string
	subject  string // the first message's: the commit goes there
	seq      uint64 // sequence of the last message published
	msgs     []batchMsg
	last     time.Time // when a message was last published
	deadline time.Time // committed: when its unconfirmed messages count as lost
	// The connection when it began: connected or not, after how many
	// reconnects.
	online     bool
	reconnects uint64
}

type batchMsg struct {
	seq    uint64
	events int
	key    string // the execution's key (broker.Key), for its subject and the log
}

const (
	// batchFlow is the most messages the stream may take before it
	// acknowledges (it asks for fewer when several batches share it).
	batchFlow = 500
	// commitAfter is how long a batch's tail waits for an acknowledgement
	// before the batch is committed to confirm it.
	commitAfter = 500 * time.Millisecond
	// Fast batch operations (the reply subject's last token but one).
	opStart     = "0"
	opAppend    = "1"
	opCommitEOB = "3"
	// Errors of the stream that end a batch, or batching altogether.
	errBatchDisabled = 10205
	errBatchUnknown  = 10208
	errBatchTooMany  = 10211
	// errNoStream marks a reply with status 503: no stream took the message
	// (it has no leader just now); the batch went with the leader.
	errNoStream = 503
	// renewAfter: a batch idle this long is left for a new one, well before
	// the stream forgets it (10 s idle by default).
	renewAfter = 5 * time.Second
)

func newBatcher(nc *nats.Conn, timeout time.Duration, log *slog.Logger, what string, lost func(int)) (*batcher, error) {
	b := &batcher{nc: nc, timeout: timeout, log: log, what: what, lost: lost, inbox: nc.NewInbox(),
		committed: map[string]*openBatch{}, room: make(chan struct{}), idle: make(chan struct{})}
	close(b.idle)
	sub, err := nc.Subscribe(b.inbox+".>", b.reply)
	if err != nil {
		return nil, err
	}
	b.sub = sub
	return b, nil
}

// publish sends m as the next message of the open batch. It waits for room
// (up to AckTimeout) while maxPending messages are unconfirmed.
func (b *batcher) publish(m *nats.Msg, events int, key string) error {
	b.mu.Lock()
	for b.pending >= maxPending && !b.disabled {
		room := b.room
		b.mu.Unlock()
		select {
		case <-room:
		case <-time.After(b.timeout):
			return errStalled
		}
		b.mu.Lock()
	}
	if b.disabled {
		b.mu.Unlock()
		return errBatchOff
	}
	now := time.Now()
	online, reconnects := b.nc.IsConnected(), b.nc.Stats().Reconnects
	if c := b.cur; c != nil && (now.Sub(c.last) > renewAfter || c.reconnects != reconnects || c.online && !online) {
		// Idle long enough for the stream to forget it soon, or begun before
		// the connection was lost, when a server that restarted no longer
		// knows it: events sent while reconnecting wait in the connection's
		// buffer and must reach the server as a batch of their own.
		if len(c.msgs) > 0 {
			b.commitLocked(now)
		}
		b.cur = nil
	}
	if b.cur == nil {
		b.cur = &openBatch{id: nats.NewInbox()[len(nats.InboxPrefix):], subject: m.Subject, online: online, reconnects: reconnects}
	}
	c := b.cur
	c.last = now
	c.seq++
	op := opAppend
	if c.seq == 1 {
		op = opStart
	}
	m.Reply = b.subject(c.id, c.seq, op)
	if err := b.nc.PublishMsg(m); err != nil {
		c.seq-- // the next message takes its place: the stream saw no gap
		b.mu.Unlock()
		return err
	}
	c.msgs = append(c.msgs, batchMsg{seq: c.seq, events: events, key: key})
	if b.pending == 0 {
		b.idle = make(chan struct{})
	}
	b.pending++
	if len(c.msgs) == 1 {
		b.arm(commitAfter)
	}
	b.mu.Unlock()
	return nil
}

var (
	errStalled  = errors.New("the stream did not acknowledge in time")
	errBatchOff = errors.New("the stream does not take batches")
)

// maxPending bounds the messages not yet confirmed, as PublishAsyncMaxPending
// bounds acknowledged ones.
const maxPending = 16384

func (b *batcher) subject(id string, seq uint64, op string) string {
	return b.inbox + "." + id + "." + strconv.Itoa(batchFlow) + ".ok." + strconv.FormatUint(seq, 10) + "." + op + ".$FI"
}

// arm (re)starts the timer that commits the open batch and expires
// committed ones. Called with mu held.
func (b *batcher) arm(d time.Duration) {
	if b.timer == nil {
		b.timer = time.AfterFunc(d, b.tick)
		return
	}
	b.timer.Reset(d)
}

// tick commits the open batch when its tail is unconfirmed, and counts the
// messages of committed batches past their deadline as not stored.
func (b *batcher) tick() {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	if c := b.cur; c != nil && len(c.msgs) > 0 {
		b.commitLocked(now)
	}
	next := time.Duration(0)
	for id, c := range b.committed {
		if left := c.deadline.Sub(now); left > 0 {
			if next == 0 || left < next {
				next = left
			}
			continue
		}
		b.lostLocked(c, c.msgs, "no acknowledgement")
		delete(b.committed, id)
	}
	if next > 0 {
		b.arm(next)
	}
}

// commitLocked ends the open batch: the stream acknowledges its commit once
// every message before it is stored.
func (b *batcher) commitLocked(now time.Time) {
	c := b.cur
	b.cur = nil
	if len(c.msgs) == 0 {
		return
	}
	c.deadline = now.Add(b.timeout)
	b.committed[c.id] = c
	m := &nats.Msg{Subject: c.subject, Reply: b.subject(c.id, c.seq+1, opCommitEOB)}
	if err := b.nc.PublishMsg(m); err != nil {
		c.deadline = now // nothing will confirm the tail
	}
	b.arm(b.timeout)
}

// flush commits the open batch and returns a channel closed once nothing is
// pending.
func (b *batcher) flush() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cur != nil && len(b.cur.msgs) > 0 {
		b.commitLocked(time.Now())
	}
	return b.idle
}

// batchReply is any message the stream sends to a fast batch's reply
// subject: a flow acknowledgement, a gap, a refused message, or the
// commit's publish acknowledgement.
type batchReply struct {
	Type    string      `json:"type"`
	Batch   string      `json:"batch"`
	Seq     uint64      `json:"seq"`
	LastSeq uint64      `json:"last_seq"`
	Count   uint64      `json:"count"`
	Error   *batchError `json:"error"`
}

// batchError is the stream's error in a reply.
type batchError struct {
	Code        int    `json:"err_code"`
	Description string `json:"description"`
}

// reply handles one message of the stream about a batch.
func (b *batcher) reply(m *nats.Msg) {
	// inbox.<batch>.<flow>.ok.<seq>.<op>.$FI
	tok := strings.Split(m.Subject[len(b.inbox)+1:], ".")
	if len(tok) != 6 {
		return
	}
	id, op := tok[0], tok[4]
	seq, _ := strconv.ParseUint(tok[3], 10, 64)
	var r batchReply
	if m.Header.Get("Status") == "503" {
		r.Error = &batchError{Code: errNoStream, Description: "no stream answered"}
	} else if err := json.Unmarshal(m.Data, &r); err != nil {
		b.log.Warn("batch reply does not decode", "of", b.what, "err", err)
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	c := b.cur
	if c == nil || c.id != id {
		c = b.committed[id]
	}
	if c == nil {
		return
	}
	switch {
	case r.Type == "ack":
		b.confirmLocked(c, r.Seq)
	case r.Type == "gap" && r.Seq > r.LastSeq:
		b.lostLocked(c, c.between(r.LastSeq, r.Seq-1), "lost on the way")
	case r.Type == "err":
		b.refusedLocked(c, r.Seq, r.Error)
	case r.Error != nil && op == opCommitEOB:
		// The commit itself was refused: the batch is gone; what it did not
		// confirm is lost.
		b.lostLocked(c, c.msgs, r.Error.Description)
		b.drop(c)
	case r.Error != nil:
		b.refusedLocked(c, seq, r.Error)
	case op == opCommitEOB || r.Type == "" && r.Batch == id:
		// The commit's acknowledgement. A replicated stream may take the
		// commit before it has stored the batch's last message; it then
		// acknowledges the commit once it has, on that message's subject.
		b.confirmLocked(c, r.Count)
		b.lostLocked(c, c.msgs, "not in the committed batch")
		b.drop(c)
	}
}

// between returns the unconfirmed messages from sequence lo to hi.
func (c *openBatch) between(lo, hi uint64) []batchMsg {
	var out []batchMsg
	for _, m := range c.msgs {
		if m.seq >= lo && m.seq <= hi {
			out = append(out, m)
		}
	}
	return out
}

// confirmLocked marks c's messages up to seq stored.
func (b *batcher) confirmLocked(c *openBatch, seq uint64) {
	n := 0
	for n < len(c.msgs) && c.msgs[n].seq <= seq {
		n++
	}
	if n == 0 {
		return
	}
	c.msgs = c.msgs[n:]
	b.releaseLocked(n)
}

// refusedLocked counts the message at seq as not stored. A stream that does
// not take batches turns batching off: later events are published one by one.
func (b *batcher) refusedLocked(c *openBatch, seq uint64, e *batchError) {
	why := "refused"
	if e != nil {
		why = e.Description
		switch e.Code {
		case errBatchDisabled:
			b.disabled = true
			fallthrough
		case errBatchUnknown, errBatchTooMany, errNoStream:
			// The stream does not know the batch (it was cleaned up, or its
			// leader changed), took no more, or has no leader to take it:
			// later events start another.
			// What this one did not confirm is counted at its deadline.
			b.retireLocked(c)
		}
	}
	b.lostLocked(c, c.between(seq, seq), why)
}

// retireLocked stops new events from joining c.
func (b *batcher) retireLocked(c *openBatch) {
	if b.cur != c {
		return
	}
	b.cur = nil
	if len(c.msgs) > 0 {
		c.deadline = time.Now().Add(b.timeout)
		b.committed[c.id] = c
		b.arm(b.timeout)
	}
}

// lostLocked counts msgs, unconfirmed messages of c, as not stored.
func (b *batcher) lostLocked(c *openBatch, msgs []batchMsg, why string) {
	if len(msgs) == 0 {
		return
	}
	gone := map[uint64]bool{}
	for _, m := range msgs {
		gone[m.seq] = true
		b.lost(m.events)
		b.log.Warn(b.what+" not stored", "execution", m.key, "events", m.events, "err", why)
	}
	kept := c.msgs[:0]
	for _, m := range c.msgs {
		if !gone[m.seq] {
			kept = append(kept, m)
		}
	}
	c.msgs = kept
	b.releaseLocked(len(msgs))
}

func (b *batcher) drop(c *openBatch) {
	delete(b.committed, c.id)
	if b.cur == c {
		b.cur = nil
	}
}

func (b *batcher) releaseLocked(n int) {
	b.pending -= n
	close(b.room)
	b.room = make(chan struct{})
	if b.pending == 0 {
		close(b.idle)
	}
}
