package trail

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/jsget"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

// Keys of the trail bucket besides the tiles.
const (
	leaseKey = "lease" // who checkpoints, until when
	keysKey  = "keys"  // the verifier keys the log's checkpointers have signed with, as the deployment states them
)

// Config configures a Checkpointer. Zero values are the defaults.
type Config struct {
	// Interval is how long the checkpointer gathers new messages before it
	// signs a checkpoint that covers them (default 1 s): the bound of the
	// lag between an event and the checkpoint that covers it, besides the
	// time to read a backlog.
	Interval time.Duration
	// Batch is the most messages one checkpoint adds (default 10,000).
	Batch int
	// Lease is how long the checkpointing duty stays with a checkpointer
	// that stops renewing it (default 10 s, at least 3 intervals): another
	// takes over after it.
	Lease time.Duration
	// Name names this checkpointer in the lease and the log.
	Name string
	// Log receives what the checkpointer does; never the key.
	Log *slog.Logger
	// Now is the checkpointer's clock (default time.Now).
	Now func() time.Time
	// OnCheckpoint, when set, is called after each checkpoint it stores:
	// the tree's size, the leaves it added and the age of the oldest of
	// them (the lag). It must not block.
	OnCheckpoint func(size int64, added int, lag time.Duration)
	// OnError, when set, is called with each failure (for metrics).
	OnError func(error)
}

// Checkpointer extends the log as audit messages are stored, keeps the
// tree's tiles in the trail bucket and signs checkpoints into the
// checkpoints stream, while it holds the checkpointing lease: one at a
// time per deployment. It never touches the audit stream's write path: it
// reads what was stored, with an ordered consumer.
type Checkpointer struct {
	b        *broker.Broker
	signer   note.Signer
	vkey     string
	known    note.Verifiers
	cfg      Config
	token    string
	st       *cpState
	mu       sync.Mutex
	holding  bool
	lastSize int64
	until    time.Time // the lease this checkpointer last wrote runs until
	// idle is the size of the last checkpoint the keys signed while
	// another holds the lease, and since when it is that size.
	idle struct {
		size  int64
		since time.Time
	}
}

// cpState is what a checkpointer holding the lease knows of the log.
type cpState struct {
	cp    *Checkpoint // the last checkpoint stored; nil before the first
	cpSeq uint64      // its sequence in the checkpoints stream (the next one's compare-and-swap)
	base  uint64      // the stream sequence of leaf 0
	e     *edge
	last  time.Time // when the stream stored the last leaf
	read  *reader
	tiles map[string]storedTile // tiles this checkpointer wrote or read, not yet full
	// behind: the last read filled a batch, more is waiting.
	behind bool
}

type storedTile struct {
	rev  uint64
	data []byte
}

// NewCheckpointer returns the checkpointer of the deployment b is
// provisioned on, signing with signer, whose verifier key is vkey; known
// verifies the checkpoints earlier keys signed (the public key file).
func NewCheckpointer(b *broker.Broker, signer note.Signer, vkey string, known note.Verifiers, cfg Config) *Checkpointer {
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.Batch <= 0 {
		cfg.Batch = 10000
	}
	if cfg.Lease <= 0 {
		cfg.Lease = max(10*time.Second, 3*cfg.Interval)
	}
	if cfg.Lease < 3*cfg.Interval {
		cfg.Lease = 3 * cfg.Interval
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Checkpointer{b: b, signer: signer, vkey: vkey, known: known, cfg: cfg, token: uuid.NewString()}
}

// Holding reports whether this checkpointer holds the lease now.
func (c *Checkpointer) Holding() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.holding
}

// Size is the size of the last checkpoint this checkpointer knows of.
func (c *Checkpointer) Size() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lastSize
}

// Run checkpoints while ctx lasts and this checkpointer holds the lease,
// and waits for the lease while another holds it. It releases the lease
// when ctx ends.
func (c *Checkpointer) Run(ctx context.Context) error {
	if c.b.Trail == nil || c.b.Checkpoints == nil || c.b.Audit == nil {
		return errors.New("trail: the broker has no trail bucket, checkpoints or audit stream: provision it with broker.Provision")
	}
	defer c.release()
	for ctx.Err() == nil {
		held := c.hold(ctx)
		c.mu.Lock()
		changed := held != c.holding
		c.holding = held
		c.mu.Unlock()
		if changed && held {
			c.cfg.Log.Info("audit checkpointer took the lease", "name", c.cfg.Name)
		}
		if !held {
			c.drop()
			sleep(ctx, c.cfg.Interval)
			continue
		}
		if err := c.step(ctx); err != nil && ctx.Err() == nil {
			c.drop()
			if errors.Is(err, errConflict) {
				c.cfg.Log.Info("another checkpointer signed meanwhile: reloading the log")
				continue
			}
			c.cfg.Log.Error("audit checkpoint failed", "err", err)
			if c.cfg.OnError != nil {
				c.cfg.OnError(err)
			}
			sleep(ctx, c.cfg.Interval)
		}
	}
	return nil
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

var errConflict = errors.New("trail: another checkpointer stored a checkpoint")

// drop forgets the log's state (its consumer included): it is loaded again
// from the store when needed.
func (c *Checkpointer) drop() {
	if c.st == nil {
		return
	}
	if c.st.read != nil {
		c.st.read.close()
	}
	c.st = nil
}

// lease is who holds the checkpointing duty, until when.
type lease struct {
	V      int       `json:"v"`
	Holder string    `json:"holder"`
	Name   string    `json:"name,omitempty"`
	Until  time.Time `json:"until"`
}

// hold takes or renews the lease, and reports whether this checkpointer
// holds it. A renewal the bucket did not answer (a cluster electing a
// leader) keeps a lease this checkpointer holds until it runs out: no other
// may take it before. A write begun finishes although ctx ends, so that
// the release that follows reads it.
func (c *Checkpointer) hold(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	now := c.cfg.Now().UTC()
	mine := &lease{V: envelope.Version, Holder: c.token, Name: c.cfg.Name, Until: now.Add(c.cfg.Lease)}
	cur, rev, err := broker.Load[lease](ctx, c.b.Trail, leaseKey)
	var junk *Msg
	if err != nil && !errors.Is(err, broker.ErrNotFound) {
		junk = c.unreadableLease(ctx)
	}
	switch {
	case errors.Is(err, broker.ErrNotFound):
		_, err = broker.Create(ctx, c.b.Trail, leaseKey, mine)
	case junk != nil:
		// Bytes no checkpointer wrote (what a stream's republish or a push
		// consumer can put there): nobody holds the lease.
		c.cfg.Log.Warn("the checkpointing lease holds what no checkpointer wrote: taking it", "bytes", len(junk.Data))
		_, err = broker.Update(ctx, c.b.Trail, leaseKey, mine, junk.Seq)
	case err != nil:
		return c.stillHeld(now)
	case cur.Holder != c.token && now.Before(cur.Until) && !c.holderIdle(ctx, now):
		c.until = time.Time{}
		return false
	case cur.Holder != c.token && now.Before(cur.Until):
		// Updated after the message as stored: a republish stores
		// headers that take the place of those the revision is read from.
		c.cfg.Log.Warn("the checkpointing lease's holder signed nothing for a lease while events wait: taking it", "holder", cur.Name, "since", c.idle.since)
		var m *Msg
		if m, err = c.storedLease(ctx); err == nil {
			_, err = broker.Update(ctx, c.b.Trail, leaseKey, mine, m.Seq)
		}
	default:
		_, err = broker.Update(ctx, c.b.Trail, leaseKey, mine, rev)
	}
	switch {
	case err == nil:
		c.until, c.idle.since = mine.Until, time.Time{}
		return true
	case errors.Is(err, broker.ErrExists) || errors.Is(err, broker.ErrRevisionMismatch) || broker.WrongLastSequence(err):
		c.until = time.Time{} // another took it meanwhile
		return false
	}
	return c.stillHeld(now)
}

// holderIdle reports whether the log's last signed checkpoint stayed the
// same for a lease while the audit stream holds events after it: the
// lease's holder does not checkpoint. It is stuck, or no checkpointer wrote
// the lease (a worker's stream republishing there can write one that
// reads as any).
func (c *Checkpointer) holderIdle(ctx context.Context, now time.Time) bool {
	var size int64
	next := uint64(1) // the stream sequence of the next leaf
	last, err := getLastOf(ctx, c.b.NC, c.b.Names.CheckpointStream(), c.b.Names.CheckpointSubject())
	if err == nil {
		var head *jetstream.RawStreamMsg
		if head, err = c.lastSigned(ctx, last); err == nil && head != nil {
			cp, _ := Open(head.Data, c.known)
			size, next = cp.Size, cp.FirstSeq+uint64(cp.Size)
		}
	}
	if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		return false
	}
	if c.idle.since.IsZero() || size != c.idle.size {
		c.idle.size, c.idle.since = size, now
		return false
	}
	if now.Sub(c.idle.since) < c.cfg.Lease {
		return false
	}
	info, err := c.b.Audit.Info(ctx)
	return err == nil && stateOf(info).LastSeq >= next
}

// unreadableLease returns the stored lease when it holds bytes that are
// not a lease, nil when it could not be read or is one. It reads the
// message as stored: the headers a republish stored with it would take
// the place of those a key-value read gets its revision from.
func (c *Checkpointer) unreadableLease(ctx context.Context) *Msg {
	m, err := c.storedLease(ctx)
	if err != nil {
		return nil
	}
	var l lease
	if envelope.Unmarshal(m.Data, &l) == nil && l.Holder != "" {
		return nil
	}
	return m
}

// storedLease reads the lease's message as stored, with the sequence a
// compare-and-swap on it names.
func (c *Checkpointer) storedLease(ctx context.Context) (*Msg, error) {
	return getStored(ctx, c.b.NC, "KV_"+c.b.Names.TrailBucket(),
		jsget.Request{LastFor: "$KV." + c.b.Names.TrailBucket() + "." + leaseKey})
}

// stillHeld reports whether the lease this checkpointer last renewed runs
// beyond now, less a margin for the clocks of the others.
func (c *Checkpointer) stillHeld(now time.Time) bool {
	return now.Add(c.cfg.Interval).Before(c.until)
}

// release ends the lease now if this checkpointer holds it, so that another
// takes over at once.
func (c *Checkpointer) release() {
	c.drop()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cur, rev, err := broker.Load[lease](ctx, c.b.Trail, leaseKey)
	if err != nil || cur.Holder != c.token {
		return
	}
	cur.Until = c.cfg.Now().UTC()
	_, _ = broker.Update(ctx, c.b.Trail, leaseKey, cur, rev)
	c.mu.Lock()
	c.holding = false
	c.mu.Unlock()
}

// step adds the messages stored since the last checkpoint (waiting up to
// an interval for them) and signs a checkpoint that covers them.
func (c *Checkpointer) step(ctx context.Context) error {
	if c.st == nil {
		st, err := c.load(ctx)
		if err != nil {
			return err
		}
		c.st = st
	}
	st := c.st
	// What the interval gathered, read at once: the server delivers a
	// batch in a few writes, not a message at a time as a waiting pull
	// would. A full batch means more is waiting: read on at once.
	if !st.behind {
		sleep(ctx, c.cfg.Interval)
	}
	msgs, err := st.read.fetch(ctx, c.cfg.Batch)
	if err != nil {
		return fmt.Errorf("read the audit stream: %w", err)
	}
	added, gaps := 0, 0
	var oldest time.Time
	for _, m := range msgs {
		seq, next := m.Seq, st.base+uint64(st.e.n)
		if seq < next {
			continue // delivered again after the consumer was reset
		}
		if seq > next {
			if err := c.confirmGap(ctx, next, seq); err != nil {
				return err
			}
		}
		for ; next < seq; next++ {
			st.e.append(tlog.RecordHash(GapLeaf(next)))
			added++
			gaps++
		}
		st.e.append(m.Leaf())
		st.last = m.Time
		if added == gaps {
			oldest = m.Time
		}
		added++
	}
	st.behind = len(msgs) >= c.cfg.Batch
	if added == 0 {
		return nil
	}
	if gaps > 0 {
		c.cfg.Log.Warn("audit stream sequences held no message when the checkpointer reached them: logged as gaps",
			"count", gaps, "before", st.base+uint64(st.e.n)-1)
	}
	if err := c.writeTiles(ctx, st.e.take()); err != nil {
		return err
	}
	info, err := c.b.Audit.Info(ctx)
	if err != nil {
		return err
	}
	retained := int64(0)
	if first := stateOf(info).FirstSeq; first > st.base {
		retained = min(int64(first-st.base), st.e.n)
	}
	cp := &Checkpoint{Origin: c.signer.Name(), Size: st.e.n, Root: st.e.root(), Stream: c.b.Names.AuditStream(),
		FirstSeq: st.base, Retained: retained, Time: st.last}
	if st.cp != nil {
		cp.Time = later(st.cp.Time, st.last)
		cp.Retained = max(cp.Retained, st.cp.Retained)
	}
	seq, err := c.store(ctx, cp, st.cpSeq)
	if err != nil {
		return err
	}
	st.cp, st.cpSeq = cp, seq
	c.mu.Lock()
	c.lastSize = cp.Size
	c.mu.Unlock()
	if c.cfg.OnCheckpoint != nil {
		lag := time.Duration(0)
		if !oldest.IsZero() {
			lag = c.cfg.Now().Sub(oldest)
		}
		c.cfg.OnCheckpoint(cp.Size, added, lag)
	}
	return nil
}

// confirmGap makes sure that the stream holds no message from sequence
// from up to before to, before they become gap leaves: a delivery lost on
// the way must be read again, never taken for a message that is not there.
// Sequences before the stream's first are gone (retention); one after it is
// asked for.
func (c *Checkpointer) confirmGap(ctx context.Context, from, to uint64) error {
	info, err := c.b.Audit.Info(ctx)
	if err != nil {
		return err
	}
	first := stateOf(info).FirstSeq
	for seq := max(from, first); seq < to; seq++ {
		_, err := getMsg(ctx, c.b.NC, c.b.Names.AuditStream(), seq)
		if err == nil {
			return fmt.Errorf("sequence %d was not delivered: reading again", seq)
		}
		if !errors.Is(err, jetstream.ErrMsgNotFound) {
			return err
		}
	}
	return nil
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// store signs cp and files it after the checkpoint at prev (0: none), by
// compare-and-swap: a checkpointer that lost the lease without knowing it
// cannot file a checkpoint beside another's. What was filed after prev
// that extends nothing (a worker's stream republishing there, or a push
// consumer delivering there, files anything, an old checkpoint of the log
// too) is passed over, and cp filed after it; a checkpoint the keys signed
// that covers more than the last one this checkpointer stored is
// another's: errConflict.
func (c *Checkpointer) store(ctx context.Context, cp *Checkpoint, prev uint64) (uint64, error) {
	signed, err := cp.Sign(c.signer)
	if err != nil {
		return 0, err
	}
	for try := 0; ; try++ {
		m := &nats.Msg{Subject: c.b.Names.CheckpointSubject(), Data: signed,
			Header: nats.Header{jetstream.ExpectedLastSubjSeqHeader: []string{strconv.FormatUint(prev, 10)}}}
		ack, err := broker.PublishAck(ctx, c.b.NC, m)
		switch {
		case err == nil:
			return ack.Seq, nil
		case !broker.WrongLastSequence(err):
			return 0, fmt.Errorf("store checkpoint %d: %w", cp.Size, err)
		case try == 10:
			return 0, errConflict
		}
		if prev, err = c.filedOver(ctx, prev); err != nil {
			return 0, err
		}
	}
}

// filedOver returns the last sequence of the checkpoints stream when
// nothing filed there after prev extends the last checkpoint this
// checkpointer stored; errConflict when a checkpoint the keys signed does
// (or there is too much to read: the log is loaded again).
func (c *Checkpointer) filedOver(ctx context.Context, prev uint64) (uint64, error) {
	last, err := getLastOf(ctx, c.b.NC, c.b.Names.CheckpointStream(), c.b.Names.CheckpointSubject())
	if err != nil {
		return 0, err
	}
	if last.Sequence <= prev || last.Sequence-prev > maxSkipped {
		return 0, errConflict
	}
	var size int64
	if c.st != nil && c.st.cp != nil {
		size = c.st.cp.Size
	}
	passed := 0
	err = readAll(ctx, c.b.JS, c.b.Names.CheckpointStream(), prev+1, func(m *Msg) error {
		if m.Seq > last.Sequence {
			return errStop
		}
		if other, err := Open(m.Data, c.known); err == nil && (other.Size > size || c.st == nil || c.st.cp == nil) {
			return errConflict
		}
		passed++
		return nil
	})
	if err != nil && !errors.Is(err, errStop) {
		return 0, err
	}
	c.cfg.Log.Warn("the checkpoints stream holds messages that extend nothing: filing the checkpoint after them ('capstan audit verify' names those the keys did not sign)",
		"count", passed, "after", prev)
	return last.Sequence, nil
}

// writeTiles stores tiles in the trail bucket. A tile only grows: one
// stored with more hashes (another checkpointer's, ahead) is left, one with
// hashes this tree does not have is an error.
func (c *Checkpointer) writeTiles(ctx context.Context, tiles []tileData) error {
	for _, td := range tiles {
		key := tileKey(td.tile.L, td.tile.N)
		for try := 0; ; try++ {
			have, ok := c.st.tiles[key]
			if !ok {
				e, err := c.b.Trail.Get(ctx, key)
				switch {
				case errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted):
				case err != nil:
					return err
				default:
					have = storedTile{rev: e.Revision(), data: e.Value()}
				}
			}
			if len(have.data) >= len(td.data) && bytes.HasPrefix(have.data, td.data) {
				break
			}
			if !bytes.HasPrefix(td.data, have.data) {
				return fmt.Errorf("stored tile %s holds other hashes than the log's: the trail bucket was changed (run 'capstan audit verify')", key)
			}
			var rev uint64
			var err error
			if have.rev == 0 {
				rev, err = c.b.Trail.Create(ctx, key, td.data)
			} else {
				rev, err = c.b.Trail.Update(ctx, key, td.data, have.rev)
			}
			if err == nil {
				have = storedTile{rev: rev, data: td.data}
				c.st.tiles[key] = have
				break
			}
			delete(c.st.tiles, key)
			if try == 2 || !(errors.Is(err, jetstream.ErrKeyExists) || broker.WrongLastSequence(err)) {
				return fmt.Errorf("store tile %s: %w", key, err)
			}
		}
		if len(td.data) == tileWidth*tlog.HashSize {
			delete(c.st.tiles, key) // full: it never changes again
		}
	}
	return nil
}

// load reads the log's last checkpoint, rebuilds the tree's right edge from
// the tiles it authenticates, checks that the audit stream still holds the
// log's last leaf, and opens a consumer on what comes after.
func (c *Checkpointer) load(ctx context.Context) (*cpState, error) {
	info, err := c.b.Audit.Info(ctx)
	if err != nil {
		return nil, err
	}
	stream := stateOf(info)
	st := &cpState{tiles: map[string]storedTile{}, e: &edge{}}
	last, err := getLastOf(ctx, c.b.NC, c.b.Names.CheckpointStream(), c.b.Names.CheckpointSubject())
	var head *jetstream.RawStreamMsg
	if err == nil {
		// The next checkpoint is filed after the last message, whatever it
		// is; it extends the last one the log's keys signed.
		st.cpSeq = last.Sequence
		if head, err = c.lastSigned(ctx, last); err == nil && head == nil {
			err = jetstream.ErrMsgNotFound
		}
	}
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		// A new log, unless the bucket holds a tree: then its checkpoints
		// were removed, and a new log would sign another history under
		// the same name.
		if _, terr := c.b.Trail.Get(ctx, tileKey(0, 0)); terr == nil && last != nil {
			return nil, fmt.Errorf("no checkpoint of the last ones stored verifies with the log's keys (%s): not extending the log; is the key file beside the public key file the log's? (run 'capstan audit verify')",
				c.signer.Name())
		} else if terr == nil {
			return nil, fmt.Errorf("the trail bucket holds a tree but the checkpoints stream %s holds no checkpoint: they were removed; not starting another log under the same name (run 'capstan audit verify')",
				c.b.Names.CheckpointStream())
		}
		// It begins with what the stream holds now.
		st.base = max(stream.FirstSeq, 1)
		if st.base > 1 {
			c.cfg.Log.Info("the audit log begins at the stream's first retained event", "seq", st.base)
		}
	case err != nil:
		return nil, fmt.Errorf("read the last checkpoint: %w", err)
	default:
		cp, err := Open(head.Data, c.known)
		if err != nil {
			return nil, err
		}
		if cp.Origin != c.signer.Name() || cp.Stream != stream.Name {
			return nil, fmt.Errorf("the last stored checkpoint is of log %q on stream %q, not %q on %q", cp.Origin, cp.Stream, c.signer.Name(), stream.Name)
		}
		st.cp, st.base, st.last = cp, cp.FirstSeq, cp.Time
		if st.e, err = edgeAt(cp.Size, tlog.TileHashReader(cp.Tree(), newTileReader(ctx, FromDeployment(c.b)))); err != nil {
			return nil, fmt.Errorf("the stored tiles do not match the last checkpoint (size %d): %w", cp.Size, err)
		}
		if err := c.continues(ctx, st, stream); err != nil {
			return nil, err
		}
	}
	// Stated once the log is this key's to extend: a checkpointer given
	// another key states nothing. A statement the bucket refuses stops
	// nothing: it is for readers given no key of their own, and what a
	// worker's stream republishes there can stand in its way.
	if err := c.publishKey(ctx); err != nil && ctx.Err() == nil {
		c.cfg.Log.Warn("the deployment does not state this checkpointer's public key; readers need their own copy (--key)", "err", err)
	}
	st.read = newReader(c.b.Audit, st.base+uint64(st.e.n))
	c.mu.Lock()
	c.lastSize = st.e.n
	c.mu.Unlock()
	return st, nil
}

// maxSkipped bounds how many messages of the checkpoints stream that the
// log's keys did not sign are read past, back from the last, to find the
// last checkpoint that they did: what a worker's stream can file there in
// the time between two checkpoints, read a window at a time.
const maxSkipped = 100_000

// scanWindow is the most messages of the checkpoints stream scanBack reads
// forward at once: 16 first, then four times as many each time.
const scanWindow = 1024

// lastSigned returns the last message of the checkpoints stream, at or
// before last, that is a checkpoint the log's keys signed; nil when none
// is. A message the keys did not sign was not filed by a checkpointer (a
// worker's stream republishing there, or a push consumer delivering
// there, can file one): it is passed over with a warning, and Verify
// reports it as forged, so that it stops nobody.
func (c *Checkpointer) lastSigned(ctx context.Context, last *jetstream.RawStreamMsg) (*jetstream.RawStreamMsg, error) {
	if _, err := Open(last.Data, c.known); err == nil {
		return last, nil
	}
	var head *jetstream.RawStreamMsg
	skipped, err := scanBack(ctx, c.b, last.Sequence, c.known, func(seq uint64, data []byte, _ *Checkpoint, signed bool) bool {
		if signed {
			head = &jetstream.RawStreamMsg{Subject: c.b.Names.CheckpointSubject(), Sequence: seq, Data: data}
		}
		return !signed
	})
	switch {
	case err != nil:
		return nil, err
	case head == nil && skipped >= maxSkipped:
		return nil, fmt.Errorf("the last %d messages of the checkpoints stream do not verify with the log's keys: not extending the log (run 'capstan audit verify')", skipped)
	case head != nil && head.Sequence < last.Sequence:
		c.cfg.Log.Warn("the checkpoints stream holds messages the log's keys did not sign: passed over ('capstan audit verify' names them)",
			"count", last.Sequence-head.Sequence, "after", head.Sequence)
	}
	return head, nil
}

// scanBack calls visit with each message of the checkpoints stream that
// reads as a checkpoint, from sequence last back, with whether keys
// verify it (nil keys: none), until visit returns false, the stream's
// first message, or maxSkipped sequences read; it returns how many it read.
// Each window is read forward, with a consumer: a flood of what extends
// nothing is passed over at the speed of a stream read.
func scanBack(ctx context.Context, b *broker.Broker, last uint64, keys note.Verifiers, visit func(seq uint64, data []byte, cp *Checkpoint, signed bool) bool) (int, error) {
	type entry struct {
		seq    uint64
		data   []byte
		cp     *Checkpoint
		signed bool
	}
	s, err := b.JS.Stream(ctx, b.Names.CheckpointStream())
	if err != nil {
		return 0, err
	}
	first := max(s.CachedInfo().State.FirstSeq, 1) // retention removed what came before
	read, width := 0, uint64(16)
	for end := last; end >= first && read < maxSkipped; width = min(4*width, scanWindow) {
		start := first
		if end-first >= width {
			start = end - width + 1
		}
		read += int(end - start + 1)
		var window []entry
		err := readAll(ctx, b.JS, b.Names.CheckpointStream(), start, func(m *Msg) error {
			if m.Seq > end {
				return errStop
			}
			if cp, err := OpenUnverified(m.Data); err == nil {
				e := entry{seq: m.Seq, data: m.Data, cp: cp}
				if keys != nil {
					if _, err := Open(m.Data, keys); err == nil {
						e.signed = true
					}
				}
				window = append(window, e)
			}
			return nil
		})
		if err != nil && !errors.Is(err, errStop) {
			return read, err
		}
		for i := len(window) - 1; i >= 0; i-- {
			if e := window[i]; !visit(e.seq, e.data, e.cp, e.signed) {
				return read, nil
			}
		}
		if start == first {
			break
		}
		end = start - 1
	}
	return read, nil
}

// getLastOf returns the last message on subject of stream, with the
// sequence the stream stored it at. (A direct get takes the sequence from
// the headers, where a message a republish stored holds another's.)
func getLastOf(ctx context.Context, nc *nats.Conn, stream, subject string) (*jetstream.RawStreamMsg, error) {
	m, err := getStored(ctx, nc, stream, jsget.Request{LastFor: subject})
	if err != nil {
		return nil, err
	}
	return &jetstream.RawStreamMsg{Subject: m.Subject, Sequence: m.Seq, Data: m.Data, Time: m.Time}, nil
}

// continues checks that the audit stream still holds the log's last leaf,
// unchanged, where the log has it (or that retention removed it): a stream
// deleted and created again, truncated or restored from an older copy is
// not extended, since its new messages would take the places of others.
func (c *Checkpointer) continues(ctx context.Context, st *cpState, stream StreamState) error {
	n := st.e.n
	if n == 0 {
		return nil
	}
	lastSeq := st.base + uint64(n) - 1
	if stream.LastSeq < lastSeq {
		return fmt.Errorf("the audit stream ends at sequence %d but the log holds it up to %d: the stream lost events (deleted and created again, truncated, or restored from an older copy): not extending the log (run 'capstan audit verify')", stream.LastSeq, lastSeq)
	}
	if lastSeq < stream.FirstSeq {
		return nil // removed by retention since
	}
	m, err := getMsg(ctx, c.b.NC, stream.Name, lastSeq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return fmt.Errorf("the audit stream has no message at sequence %d, the log's last leaf: not extending the log (run 'capstan audit verify')", lastSeq)
	}
	if err != nil {
		return err
	}
	hs, err := tlog.TileHashReader(st.cp.Tree(), newTileReader(ctx, FromDeployment(c.b))).ReadHashes([]int64{tlog.StoredHashIndex(0, n-1)})
	if err != nil {
		return err
	}
	if m.Leaf() != hs[0] && tlog.RecordHash(GapLeaf(lastSeq)) != hs[0] {
		return fmt.Errorf("the audit stream's message at sequence %d is not the log's last leaf: the stream was changed: not extending the log (run 'capstan audit verify')", lastSeq)
	}
	return nil
}

// publishKey adds this checkpointer's verifier key to those the deployment
// states, for readers that were given none.
func (c *Checkpointer) publishKey(ctx context.Context) error {
	for try := 0; try < 3; try++ {
		e, err := c.b.Trail.Get(ctx, keysKey)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted):
			_, err = c.b.Trail.Create(ctx, keysKey, []byte(c.vkey+"\n"))
		case err != nil:
			return err
		case strings.Contains("\n"+string(e.Value()), "\n"+c.vkey+"\n"):
			return nil
		default:
			_, err = c.b.Trail.Update(ctx, keysKey, append(e.Value(), c.vkey+"\n"...), e.Revision())
		}
		if err == nil {
			return nil
		}
	}
	return fmt.Errorf("publish the verifier key: the trail bucket keeps changing")
}

// getMsg reads the message at seq as it is stored, headers whole (a direct
// get would add the stream's own).
func getMsg(ctx context.Context, nc *nats.Conn, stream string, seq uint64) (*Msg, error) {
	return getStored(ctx, nc, stream, jsget.Request{Seq: seq})
}

// getStored reads the message a message get request (by sequence, or the
// last of a subject) names, as it is stored; jetstream.ErrMsgNotFound when
// the stream holds none.
func getStored(ctx context.Context, nc *nats.Conn, stream string, req jsget.Request) (*Msg, error) {
	m, err := jsget.Get(ctx, nc, stream, req)
	if errors.Is(err, jsget.ErrNoMessage) {
		return nil, jetstream.ErrMsgNotFound
	}
	if err != nil {
		return nil, err
	}
	out := &Msg{Seq: m.Sequence, Subject: m.Subject, Data: m.Data, Time: m.Time}
	if len(m.Header) > 0 {
		out.Header = m.Header
	}
	return out, nil
}
