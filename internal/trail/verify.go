package trail

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

// What a Problem is.
const (
	// An event's content differs from the log's leaf at its place.
	KindEdited = "edited"
	// The log's leaf has no message at its place: the stream skips it, or
	// ends before it.
	KindMissing = "missing"
	// The log's leaves are all there, in another order.
	KindReordered = "reordered"
	// The stream holds messages the log does not have, before leaves it
	// has.
	KindAppendedBefore = "appended before"
	// Events were removed from the front of the stream sooner than its age
	// limit removes them.
	KindRemovedEarly = "removed early"
	// A stored checkpoint whose signature does not verify with the keys.
	KindForged = "forged checkpoint"
	// A checkpoint (stored or kept) that the log's leaves do not hash to:
	// the log was rewritten, or its stored hashes changed.
	KindInconsistent = "inconsistent checkpoint"
	// A stored tile whose hashes are not the ones the events hash to:
	// inclusion proofs read it, and the checkpointer extends nothing over
	// it.
	KindTile = "changed tile"
)

// Problem is one thing Verify found wrong.
type Problem struct {
	Kind string `json:"kind"`
	// Leaf is the first leaf concerned, Seq its stream sequence, Count how
	// many leaves from it (0: none in particular).
	Leaf  int64  `json:"leaf"`
	Seq   uint64 `json:"seq,omitempty"`
	Count int64  `json:"count,omitempty"`
	// Execution is the execution the stream's message at Seq names, when
	// there is one.
	Execution string `json:"execution,omitempty"`
	// Detail says it in a sentence.
	Detail string `json:"detail"`
}

// Report is what Verify found.
type Report struct {
	Origin string `json:"origin"`
	Stream string `json:"stream"`
	// FirstSeq is the stream sequence of leaf 0.
	FirstSeq uint64 `json:"firstSeq"`
	// Size is the size of the latest valid stored checkpoint, Time its time.
	Size int64     `json:"size"`
	Time time.Time `json:"time"`
	// Checkpoints counts the stored checkpoints, Verified those whose
	// signature verified and whose root the log's leaves hash to.
	Checkpoints int `json:"checkpoints"`
	Verified    int `json:"verified"`
	// Messages counts the messages read from the stream; Unchecked those
	// past the latest checkpoint, not yet covered by one.
	Messages  int64 `json:"messages"`
	Unchecked int64 `json:"unchecked"`
	// RemovedByRetention counts the leaves before the first the stream
	// still holds, proved by the stored hashes alone; MaxAge is the
	// stream's age limit.
	RemovedByRetention int64         `json:"removedByRetention"`
	MaxAge             time.Duration `json:"maxAge"`
	// Kept is the size of the checkpoint the auditor kept (0: none given);
	// KeptHolds reports that every event it covered is still there,
	// unchanged and in order.
	Kept      int64 `json:"kept,omitempty"`
	KeptHolds bool  `json:"keptHolds,omitempty"`
	// Problems, the first event that does not match first.
	Problems []Problem `json:"problems,omitempty"`
	// Latest is the latest stored checkpoint, signed: when the report is
	// OK, one that extends the kept checkpoint, for a witness to keep next.
	Latest []byte `json:"-"`
}

// OK reports whether nothing was found wrong.
func (r *Report) OK() bool { return len(r.Problems) == 0 }

// VerifyOptions are Verify's optional inputs.
type VerifyOptions struct {
	// Kept is a signed checkpoint the auditor kept, with, when it came from
	// an exported bundle, that bundle's tiles (which then name the first
	// event that differs even from a log rewritten whole).
	Kept      []byte
	KeptTiles Source
	// Now is the verifier's clock (default time.Now).
	Now func() time.Time
}

// retentionSlack allows for the interval at which JetStream removes expired
// messages and for clocks that differ between a cluster's nodes.
const retentionSlack = 5 * time.Minute

// window is how far past the first difference Verify looks to tell an edit
// from a move.
const window = 256

// Verify checks the log src holds against the keys: every stored
// checkpoint's signature; that the leaves recomputed from the events, and
// the stored hashes of the events retention removed, hash to every
// checkpoint's root (so each later checkpoint is consistent with each
// earlier one); and, given a kept checkpoint, that everything it covered is
// still there, unchanged and in order. It names the first event that does
// not match and what kind of change it is. An error is returned only when
// the log could not be read; what is wrong with it is in the report.
func Verify(ctx context.Context, src Source, keys note.Verifiers, opts VerifyOptions) (*Report, error) {
	now := time.Now
	if opts.Now != nil {
		now = opts.Now
	}
	stream, err := src.Stream(ctx)
	if err != nil {
		return nil, err
	}
	r := &Report{Stream: stream.Name, MaxAge: stream.MaxAge}
	// Every stored checkpoint, streamed: its signature checked, a compact
	// record of it kept (a month of one a second is millions).
	var checks []check
	var latest *Checkpoint
	i := 0
	err = src.Checkpoints(ctx, func(s []byte) error {
		i++
		r.Checkpoints++
		cp, err := Open(s, keys)
		if err != nil {
			p := Problem{Kind: KindForged, Detail: fmt.Sprintf("stored checkpoint %d does not verify with the keys: %v", i, err)}
			if u, uerr := OpenUnverified(s); uerr == nil {
				p.Leaf = u.Size
				p.Detail = fmt.Sprintf("stored checkpoint %d (size %d) does not verify with the keys: %v", i, u.Size, err)
			}
			r.Problems = append(r.Problems, p)
			return nil
		}
		if latest != nil && (cp.Origin != latest.Origin || cp.FirstSeq != latest.FirstSeq || cp.Stream != latest.Stream) {
			r.Problems = append(r.Problems, Problem{Kind: KindInconsistent, Leaf: cp.Size,
				Detail: fmt.Sprintf("stored checkpoint %d is of log %q (stream %s from %d), the one before of %q (stream %s from %d)",
					i, cp.Origin, cp.Stream, cp.FirstSeq, latest.Origin, latest.Stream, latest.FirstSeq)})
			return nil
		}
		// One smaller than the one before is checked as any other: an
		// earlier checkpoint filed again (what a worker's stream can
		// republish there) states nothing new.
		checks = append(checks, check{size: cp.Size, root: cp.Root, time: cp.Time})
		if latest == nil || cp.Size >= latest.Size {
			latest = cp
			r.Latest = append(r.Latest[:0], s...)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	var kept *Checkpoint
	if opts.Kept != nil {
		if kept, err = Open(opts.Kept, keys); err != nil {
			return nil, fmt.Errorf("the kept checkpoint: %w", err)
		}
		r.Kept = kept.Size
	}
	if latest == nil && kept == nil {
		if r.Checkpoints == 0 {
			return nil, ErrNoLog
		}
		return r, nil // every stored checkpoint is forged: nothing to check the events against
	}
	ref := latest
	if ref == nil || kept != nil && kept.Size > ref.Size {
		ref = kept
	}
	if latest != nil {
		r.Origin, r.FirstSeq, r.Size, r.Time = latest.Origin, latest.FirstSeq, latest.Size, latest.Time
	} else {
		r.Origin, r.FirstSeq = kept.Origin, kept.FirstSeq
	}
	if kept != nil && (kept.Origin != r.Origin || kept.FirstSeq != r.FirstSeq || kept.Stream != stream.Name) {
		r.Problems = append(r.Problems, Problem{Kind: KindInconsistent, Leaf: kept.Size,
			Detail: fmt.Sprintf("the kept checkpoint is of log %q (stream %s from %d); the deployment's is %q (stream %s from %d): the log was started again",
				kept.Origin, kept.Stream, kept.FirstSeq, r.Origin, stream.Name, r.FirstSeq)})
	}
	base := r.FirstSeq
	if stream.Name != "" && ref.Stream != "" && stream.Name != ref.Stream {
		return nil, fmt.Errorf("the log is of stream %s, the events read are of %s", ref.Stream, stream.Name)
	}

	// The roots to check, by size: every checkpoint's, the kept one's.
	if kept != nil {
		checks = append(checks, check{size: kept.Size, root: kept.Root, time: kept.Time, kept: true})
	}
	slices.SortStableFunc(checks, func(a, b check) int { return cmp.Compare(a.size, b.size) })
	v := &verifier{ctx: ctx, src: src, r: r, base: base, checks: checks, kept: kept, keptTiles: opts.KeptTiles}

	// Where the stream begins: the leaves before it were removed.
	retained := int64(0)
	if stream.FirstSeq > base {
		retained = int64(stream.FirstSeq - base)
	}
	// Pass 1: the stored hashes, from leaf 0 up to the largest checkpoint
	// (and at least to where the stream begins), against every checkpoint.
	if err := v.hashes(max(ref.Size, retained), retained); err != nil {
		return nil, err
	}
	// Retention: what is gone from the front, and whether its age allowed it.
	if retained > 0 {
		v.retention(retained, stream, now())
	}
	// Pass 2: the events, from the first the stream holds.
	if err := v.events(retained, ref.Size); err != nil {
		return nil, err
	}
	if latest != nil && r.Messages > 0 {
		r.Unchecked = max(0, v.evented-latest.Size)
	}
	r.Verified = v.verdicts(max(v.hashed, v.evented), v.diff)
	v.leafTiles()
	if kept != nil {
		r.KeptHolds = r.OK()
	}
	return r, nil
}

// check is one root to compare at a size: a stored checkpoint's, or the
// kept one's.
type check struct {
	size int64
	root tlog.Hash
	time time.Time
	kept bool
	// hashes: the stored hashes hash to it; events: the tree recomputed
	// from the events reached its size (and evOK: hashes to it).
	hashes, events, evOK bool
}

// ok is the check's verdict: the events' when they reached its size, the
// stored hashes' otherwise.
func (c *check) ok() bool {
	if c.events {
		return c.evOK
	}
	return c.hashes
}

type verifier struct {
	ctx       context.Context
	src       Source
	r         *Report
	base      uint64
	kept      *Checkpoint
	keptTiles Source
	checks    []check // by size

	at       *edge    // the edge at the first retained leaf
	trusted  int64    // leaves below it are the ones a trusted checkpoint signed
	hashed   int64    // the leaves the stored hashes cover
	evented  int64    // the leaves the events reached
	diff     *Problem // the first leaf that differs
	evCursor int      // the events' place in checks

	tiles  *tileReader // the deployment's, for the reference leaves
	keptTR *tileReader
	// tileChanged is the first changed tile found, reported after the
	// events' problems.
	tileChanged *Problem
	// holes is the first run of sequences without a message after the
	// stream's first, holeCount how many there are.
	holes     *Problem
	holeCount int64
}

// due calls fn with each check of size n, advancing cursor past the
// smaller ones.
func (v *verifier) due(cursor *int, n int64, fn func(c *check)) {
	for *cursor < len(v.checks) && v.checks[*cursor].size <= n {
		if c := &v.checks[*cursor]; c.size == n {
			fn(c)
		}
		*cursor++
	}
}

// leafTiles reports a changed tile: one above the leaves' found while
// hashing, or the leaves' own stored hashes when they do not hash to a
// stored checkpoint that the events hash to (the tiles changed, not the
// events).
func (v *verifier) leafTiles() {
	for i := range v.checks {
		c := &v.checks[i]
		switch {
		case v.tileChanged != nil || c.kept || !c.events || !c.evOK || c.hashes:
		case c.size <= v.hashed:
			v.tileChanged = &Problem{Kind: KindTile, Leaf: c.size,
				Detail: fmt.Sprintf("the stored hashes of the leaves do not hash to the checkpoint of size %d, which the events do: a tile of the leaves below it changed", c.size)}
		default:
			// The tiles end inside the log: proofs of the leaves from
			// there fail, and retention would leave them unproved.
			v.tileChanged = &Problem{Kind: KindTile, Leaf: v.hashed,
				Detail: fmt.Sprintf("the stored hashes end at leaf %d, inside the checkpoint of size %d, which the events hash to: tile %s was removed or cut",
					v.hashed, c.size, tileKey(0, v.hashed/tileWidth))}
		}
	}
	if v.tileChanged != nil {
		v.r.Problems = append(v.r.Problems, *v.tileChanged)
	}
}

// verdicts counts the stored checkpoints that hold, and reports those that
// do not, below the first leaf that differs (which explains the others)
// and within what was read.
func (v *verifier) verdicts(covered int64, diff *Problem) int {
	n := 0
	for i := range v.checks {
		c := &v.checks[i]
		switch {
		case c.ok():
			if !c.kept {
				n++
			}
		case c.size > covered || diff != nil && c.size > diff.Leaf:
		case c.kept:
			v.r.Problems = append(v.r.Problems, Problem{Kind: KindInconsistent, Leaf: c.size,
				Detail: fmt.Sprintf("the log does not hash to the kept checkpoint (size %d): it was rewritten since that checkpoint was signed", c.size)})
		default:
			v.r.Problems = append(v.r.Problems, Problem{Kind: KindInconsistent, Leaf: c.size,
				Detail: fmt.Sprintf("the log does not hash to its stored checkpoint of size %d (to %s): a leaf before it differs from the one it signed, or the checkpoint belongs to another history",
					c.size, c.time.UTC().Format(time.RFC3339))})
		}
	}
	return n
}

// refTile is the level-0 tile holding leaf i in the reference: the kept
// bundle's while the kept checkpoint covers i, the deployment's otherwise.
func (v *verifier) refTile(i int64) ([]byte, error) {
	n := i / tileWidth
	if v.fromKept(i) {
		if v.keptTR == nil {
			v.keptTR = newTileReader(v.ctx, v.keptTiles)
		}
		return v.keptTR.read(0, n)
	}
	if v.tiles == nil {
		v.tiles = newTileReader(v.ctx, v.src)
	}
	return v.tiles.read(0, n)
}

// fromKept reports whether the reference's leaf i comes from the kept
// bundle.
func (v *verifier) fromKept(i int64) bool {
	return v.keptTiles != nil && v.kept != nil && i < v.kept.Size
}

// refLeaf is the reference's hash of leaf i, or false when none is stored.
func (v *verifier) refLeaf(i int64) (tlog.Hash, bool) {
	d, err := v.refTile(i)
	k := int(i%tileWidth) * tlog.HashSize
	if err != nil || len(d) < k+tlog.HashSize {
		return tlog.Hash{}, false
	}
	var h tlog.Hash
	copy(h[:], d[k:])
	return h, true
}

// hashes runs the stored leaf hashes through a tree from leaf 0 to upTo,
// comparing its root with every checkpoint on the way, and keeps the tree's
// edge at retained for the events. The leaves below the largest size whose
// checkpoint matched (the kept one's, when one was given) are trusted:
// they name the first event that differs.
func (v *verifier) hashes(upTo, retained int64) error {
	e := &edge{}
	if retained == 0 {
		v.at = &edge{}
	}
	matchedKept, matched := false, int64(0)
	cursor := 0
	compare := func() {
		v.due(&cursor, e.n, func(c *check) {
			if e.root() == c.root {
				c.hashes, matched = true, e.n
				matchedKept = matchedKept || c.kept
			}
		})
	}
	compare()
	for e.n < upTo {
		d, err := v.refTile(e.n)
		if errors.Is(err, ErrNoTile) {
			break
		}
		if err != nil {
			return err
		}
		kept := v.fromKept(e.n)
		start := e.n
		for k := int(e.n % tileWidth); k < len(d)/tlog.HashSize && e.n < upTo && v.fromKept(e.n) == kept; k++ {
			var h tlog.Hash
			copy(h[:], d[k*tlog.HashSize:])
			e.append(h)
			compare()
			if e.n == retained {
				v.at = cloneEdge(e)
			}
		}
		if err := v.compareTiles(e.take(), false); err != nil {
			return err
		}
		if e.n == start || len(d) < tileWidth*tlog.HashSize && v.fromKept(e.n) == kept {
			break // a partial tile: the last
		}
	}
	if err := v.compareTiles(e.take(), true); err != nil {
		return err
	}
	// The leaves a signed root authenticates, and, given a kept
	// checkpoint, only when they are the ones it signed.
	if v.kept == nil || matchedKept {
		v.trusted = matched
	}
	v.hashed = e.n
	return nil
}

// compareTiles checks the stored tiles above the leaves' against those
// the leaves' stored hashes make (full ones, and with partial the last of
// each level too): a stored tile holds them, or more (a checkpointer
// stored it ahead of its checkpoint). The first that does not is reported.
// The leaves' own tiles are checked against the checkpoints' roots.
func (v *verifier) compareTiles(tiles []tileData, partial bool) error {
	for _, td := range tiles {
		if td.tile.L == 0 || v.tileChanged != nil || v.keptTiles != nil || !partial && len(td.data) < tileWidth*tlog.HashSize {
			continue
		}
		stored, err := v.src.Tile(v.ctx, td.tile.L, td.tile.N)
		if errors.Is(err, ErrNoTile) {
			continue // a bundle of an older version, or a store without it: proofs say so
		}
		if err != nil {
			return err
		}
		if !bytes.HasPrefix(stored, td.data) {
			v.tileChanged = &Problem{Kind: KindTile, Leaf: td.tile.N << (TileHeight * td.tile.L),
				Detail: fmt.Sprintf("stored tile %s does not hold the hashes of the leaves below it", tileKey(td.tile.L, td.tile.N))}
		}
	}
	return nil
}

func cloneEdge(e *edge) *edge {
	c := &edge{n: e.n, roots: slices.Clone(e.roots), rows: cloneRows(e.rows)}
	return c
}

func cloneRows(rows [][]tlog.Hash) [][]tlog.Hash {
	out := make([][]tlog.Hash, len(rows))
	for i, r := range rows {
		out[i] = slices.Clone(r)
	}
	return out
}

// retention judges the leaves before retained, which the stream no longer
// holds: removed by its age limit, or sooner. Leaf retained-1 was stored
// at or after the time of every checkpoint smaller than retained (their
// time is their last leaf's, and the stream stores in order).
func (v *verifier) retention(retained int64, stream StreamState, now time.Time) {
	v.r.RemovedByRetention = retained
	var after time.Time // the last removed leaf was stored at or after it
	for _, c := range v.checks {
		if !c.kept && c.size < retained && c.size > 0 && c.time.After(after) {
			after = c.time
		}
	}
	seq := v.base + uint64(retained) - 1
	switch {
	case stream.MaxAge <= 0:
		v.r.Problems = append(v.r.Problems, Problem{Kind: KindRemovedEarly, Leaf: 0, Seq: v.base, Count: retained,
			Detail: fmt.Sprintf("the stream keeps events for ever, yet leaves 0 to %d (sequences %d to %d) are gone", retained-1, v.base, seq)})
		v.r.RemovedByRetention = 0
	case !after.IsZero() && after.After(now.Add(-stream.MaxAge+retentionSlack)):
		v.r.Problems = append(v.r.Problems, Problem{Kind: KindRemovedEarly, Leaf: retained - 1, Seq: seq,
			Detail: fmt.Sprintf("leaf %d (sequence %d) is gone, but it was stored after %s, within the stream's age limit of %v",
				retained-1, seq, after.UTC().Format(time.RFC3339), stream.MaxAge)})
		v.r.RemovedByRetention = 0
	}
	if v.at == nil {
		v.r.Problems = append(v.r.Problems, Problem{Kind: KindInconsistent, Leaf: 0, Count: retained,
			Detail: fmt.Sprintf("the stored hashes of the %d leaves retention removed are missing: the events left cannot be proved", retained)})
	}
}

// events reads the stream from its first message and compares each leaf
// with the trusted reference and each checkpoint's root with the tree.
func (v *verifier) events(retained, refSize int64) error {
	if v.at == nil {
		return nil
	}
	e := v.at
	v.evCursor = 0
	for v.evCursor < len(v.checks) && v.checks[v.evCursor].size < e.n {
		v.evCursor++ // below where the events begin: the stored hashes' to check
	}
	v.due(&v.evCursor, e.n, func(c *check) { c.events, c.evOK = true, e.root() == c.root })
	var diff *Problem // the first leaf that differs, awaiting its window
	var ms []tlog.Hash
	var msgs []*Msg
	defer func() { v.evented = e.n; v.diff = diff }()
	next := v.base + uint64(retained) // the sequence of the next leaf
	seen := false
	err := v.src.Messages(v.ctx, next, func(m *Msg) error {
		v.r.Messages++
		if m.Seq < next {
			return nil
		}
		if !seen && m.Seq > next {
			// The age limit went on removing the oldest while this read:
			// they are proved by the stored hashes, as the others removed.
			if st, err := v.src.Stream(v.ctx); err == nil && st.FirstSeq >= m.Seq {
				for ; next < m.Seq; next++ {
					h, ok := v.refLeaf(int64(next - v.base))
					if !ok {
						break
					}
					if err := v.leaf(e, &diff, &ms, &msgs, &Msg{Seq: next}, h); err != nil {
						return err
					}
					v.r.RemovedByRetention++
				}
			}
		}
		seen = true
		// A sequence without a message is the gap's leaf: the log's too
		// when the message was gone before the checkpointer read it. The
		// stream denies deletes and retention removes from the front
		// only: a hole after its first message was made by hand.
		for ; next < m.Seq; next++ {
			if err := v.leaf(e, &diff, &ms, &msgs, &Msg{Seq: next}, tlog.RecordHash(GapLeaf(next))); err != nil {
				return err
			}
			if diff == nil {
				v.hole(next)
			}
		}
		next++
		return v.leaf(e, &diff, &ms, &msgs, m, m.Leaf())
	})
	if err != nil && !errors.Is(err, errStop) {
		return err
	}
	if v.holes != nil && (diff == nil || v.holes.Leaf < diff.Leaf) {
		p := *v.holes
		p.Detail = fmt.Sprintf("leaf %d (sequence %d) has no message in the stream, nor in the log: it was removed before the checkpointer read it, from a stream that denies deletes (%d such sequence(s) in all)",
			p.Leaf, p.Seq, v.holeCount)
		v.r.Problems = append([]Problem{p}, v.r.Problems...)
	}
	switch {
	case diff != nil:
		v.classify(diff, ms, msgs)
		v.r.Problems = append([]Problem{*diff}, v.r.Problems...)
	case e.n < refSize:
		seq := v.base + uint64(e.n)
		v.r.Problems = append([]Problem{{Kind: KindMissing, Leaf: e.n, Seq: seq, Count: refSize - e.n,
			Detail: fmt.Sprintf("leaves %d to %d (sequences %d to %d) are not in the stream, which ends before them: truncated, or restored from an older copy",
				e.n, refSize-1, seq, v.base+uint64(refSize)-1)}}, v.r.Problems...)
	}
	return nil
}

var errStop = errors.New("stop")

// hole notes that the stream has no message at seq, where the log holds a
// gap's leaf too: the first of them is reported as missing, with the run
// of sequences it begins.
func (v *verifier) hole(seq uint64) {
	v.holeCount++
	switch {
	case v.holes == nil:
		v.holes = &Problem{Kind: KindMissing, Leaf: int64(seq - v.base), Seq: seq, Count: 1}
	case v.holes.Seq+uint64(v.holes.Count) == seq:
		v.holes.Count++
	}
}

// leaf adds one leaf of the stream (m, hash h) to the tree.
func (v *verifier) leaf(e *edge, diff **Problem, ms *[]tlog.Hash, msgs *[]*Msg, m *Msg, h tlog.Hash) error {
	i := e.n
	if *diff != nil {
		*ms, *msgs = append(*ms, h), append(*msgs, m)
		if len(*ms) >= window {
			return errStop
		}
		return nil
	}
	if i < v.trusted {
		if want, ok := v.refLeaf(i); ok && want != h {
			*diff = &Problem{Leaf: i, Seq: m.Seq, Execution: m.Execution()}
			*ms, *msgs = append(*ms, h), append(*msgs, m)
			return nil
		}
	}
	e.append(h)
	v.due(&v.evCursor, e.n, func(c *check) { c.events, c.evOK = true, e.root() == c.root })
	return nil
}

// classify says what kind of change the first differing leaf is, from the
// stream's leaves ms (from the difference on) and the reference's.
func (v *verifier) classify(p *Problem, ms []tlog.Hash, msgs []*Msg) {
	i := p.Leaf
	var ref []tlog.Hash
	for k := int64(0); k < window && i+k < v.trusted; k++ {
		h, ok := v.refLeaf(i + k)
		if !ok {
			break
		}
		ref = append(ref, h)
	}
	posM := slices.Index(ms, ref[0]) // where the log's leaf i is in the stream now
	posL := -1                       // which of the log's leaves the stream's message at i is
	if len(ms) > 0 {
		posL = slices.Index(ref, ms[0])
	}
	gap := len(msgs) > 0 && msgs[0].Subject == ""
	seqs := func(n int) string {
		if n == 1 {
			return fmt.Sprintf("sequence %d", v.base+uint64(i))
		}
		return fmt.Sprintf("sequences %d to %d", v.base+uint64(i), v.base+uint64(i)+uint64(n)-1)
	}
	at := fmt.Sprintf("leaf %d (sequence %d)", i, p.Seq)
	named := fmt.Sprintf("leaf %d (sequence %d, execution %s)", i, p.Seq, p.Execution)
	if p.Execution == "" {
		named = at
	}
	switch {
	case gap || posM < 0 && posL > 0:
		// The message now at i is another leaf's: the one missing is
		// known by its place alone.
		p.Kind, p.Execution = KindMissing, ""
		n := max(posL, 1)
		p.Count = int64(n)
		p.Detail = fmt.Sprintf("%s is not in the stream: the messages after it moved up one place", at)
		if n > 1 {
			p.Detail = fmt.Sprintf("leaves %d to %d (%s) are not in the stream: the messages after them moved up %d places", i, i+int64(n)-1, seqs(n), n)
		}
		if gap {
			p.Detail = fmt.Sprintf("%s is not in the stream: it has no message at %s", at, seqs(1))
		}
	case posM > 0 && posL < 0:
		p.Kind = KindAppendedBefore
		p.Count = int64(posM)
		p.Detail = fmt.Sprintf("the stream holds %d message(s) the log does not have before %s, the first at sequence %d naming execution %s",
			posM, at, p.Seq, p.Execution)
	case posM > 0 && posL > 0:
		p.Kind = KindReordered
		p.Detail = fmt.Sprintf("%s holds the log's leaf %d, and the log's leaf %d is now at sequence %d", named,
			i+int64(posL), i, v.base+uint64(i)+uint64(posM))
	default:
		p.Kind = KindEdited
		p.Detail = fmt.Sprintf("%s differs from the message the log holds there", named)
	}
}
