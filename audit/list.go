package audit

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/nats-io/nats.go"
)

// Query selects index entries for List. Zero fields select everything.
type Query struct {
	// Principal, Status: exact.
	Principal string `json:"principal,omitempty"`
	Status    string `json:"status,omitempty"` // one of EntryStatuses
	// CapabilityID is an id, or a prefix ending in "*" (orders.* or ord*).
	CapabilityID string `json:"capabilityId,omitempty"`
	// Actor is kind:id, or an id of any kind.
	Actor string `json:"actor,omitempty"`
	// Since and Until bound when the entry was written (an execution's end,
	// or its start while it runs).
	Since time.Time `json:"since,omitzero"`
	Until time.Time `json:"until,omitzero"` // see Since
	// IDPrefix keeps the executions whose id begins with it.
	IDPrefix string `json:"idPrefix,omitempty"`
	// Limit is the page's size: default DefaultLimit, at most MaxLimit.
	Limit int `json:"limit,omitempty"`
	// Before is the cursor: entries stored before this index sequence (a
	// Page's Next); 0 from the newest. With BeforeEntry, also the first
	// BeforeEntry entries of the message at Before: a message may hold
	// several (decodeEntries), and a page may end inside one.
	Before      uint64 `json:"before,omitempty"`
	BeforeEntry int    `json:"beforeEntry,omitempty"` // see Before
}

// Page limits.
const (
	DefaultLimit = 50
	MaxLimit     = 500
	// maxScanned bounds the entries one List reads (after the server's
	// subject filter): a page whose filter the subjects cannot express (an
	// actor's kind, a capability prefix inside a token, an id prefix) and
	// that matches little ends there with a cursor to go on from.
	maxScanned = 200_000
)

// untilSlack is how far past Query.Until a listing reads the index.
const untilSlack = time.Second

// denseAfter is how many matches of a window are read one by one before the
// rest are read in batches.
const denseAfter = 16

// Page is one page of a listing, newest first.
type Page struct {
	// Entries are the matching entries, newest first, at most the query's
	// Limit; an execution appears once in a page, by the newest of its
	// entries that match.
	Entries []Entry `json:"entries"`
	// Next is the cursor of the next, older page (Query.Before, with
	// NextEntry as Query.BeforeEntry); 0 when nothing older matches.
	Next      uint64 `json:"next,omitempty"`
	NextEntry int    `json:"nextEntry,omitempty"` // see Next
	// Scanned is how many entries were read to make the page.
	Scanned int `json:"scanned"`
}

// Cursor is Next as one string, "" when nothing older matches: the index
// sequence, and ".<entry>" when the page ended inside a message. SetCursor
// reads it back.
func (p *Page) Cursor() string {
	switch {
	case p.Next == 0:
		return ""
	case p.NextEntry > 0:
		return strconv.FormatUint(p.Next, 10) + "." + strconv.Itoa(p.NextEntry)
	}
	return strconv.FormatUint(p.Next, 10)
}

// SetCursor sets q's Before and BeforeEntry from a page's Cursor.
func (q *Query) SetCursor(c string) error {
	seq, entry, found := strings.Cut(c, ".")
	n, err := strconv.ParseUint(seq, 10, 64)
	if err != nil {
		return fmt.Errorf("cursor %q: not one of this listing's", c)
	}
	k := 0
	if found {
		if k, err = strconv.Atoi(entry); err != nil || k <= 0 {
			return fmt.Errorf("cursor %q: not one of this listing's", c)
		}
	}
	q.Before, q.BeforeEntry = n, k
	return nil
}

// subjectFilter returns the subject filter that expresses what of q the index's
// subjects carry.
func (q Query) subjectFilter(n broker.Names) string {
	capID := q.CapabilityID
	if p, ok := strings.CutSuffix(capID, "*"); ok {
		capID = ""
		if i := strings.LastIndexByte(p, '.'); i >= 0 {
			capID = p[:i+1] // orders.* → orders., or.ders* → or.
		}
	}
	_, actorID := splitActor(q.Actor)
	return n.IndexFilter(q.Principal, q.Status, actorID, capID)
}

// Match reports whether e meets everything q asks.
func (q Query) Match(e *Entry) bool {
	if q.Principal != "" && e.Principal != q.Principal {
		return false
	}
	if q.Status != "" && e.Status != q.Status {
		return false
	}
	if c := q.CapabilityID; c != "" {
		if p, ok := strings.CutSuffix(c, "*"); ok {
			if !strings.HasPrefix(e.CapabilityID, p) {
				return false
			}
		} else if e.CapabilityID != c {
			return false
		}
	}
	if q.Actor != "" {
		kind, id := splitActor(q.Actor)
		if e.Actor.ID != id || kind != "" && e.Actor.Kind != kind {
			return false
		}
	}
	if q.IDPrefix != "" && !strings.HasPrefix(e.ExecutionID, q.IDPrefix) {
		return false
	}
	if !q.Since.IsZero() && e.UpdatedAt.Before(q.Since) {
		return false
	}
	if !q.Until.IsZero() && !e.UpdatedAt.Before(q.Until) {
		return false
	}
	return true
}

// splitActor reads kind:id, or an id alone.
func splitActor(a string) (kind, id string) {
	if k, i, ok := strings.Cut(a, ":"); ok {
		return k, i
	}
	return "", a
}

// List returns one page of the executions index, newest first: the entries
// q selects, the newest entry of each execution only (within what the page
// read). The index has no reverse iterator, so List reads backwards in
// windows: from the cursor (or the stream's end) it takes the window of
// sequences before it, reads that window forward with batched direct gets
// filtered by q's subject (the server skips what does not match with its
// per-subject index and each block's subject state), keeps the newest
// matches, and moves to a window four times as large until the page is full,
// the stream (or q.Since) begins, or maxScanned entries were read. The first
// page of a dense filter is one window; a rare one reads as many windows as
// it takes to find it, each answered from the server's indexes.
func List(ctx context.Context, b *broker.Broker, q Query) (*Page, error) {
	if b.Index == nil {
		return nil, fmt.Errorf("%w: the executions index (stream %s) does not exist: a worker of this version creates it",
			broker.ErrNotFound, b.Names.IndexStream())
	}
	return listStream(ctx, b.NC, b.Names, b.Names.IndexStream(), q)
}

func listStream(ctx context.Context, nc *nats.Conn, n broker.Names, stream string, q Query) (*Page, error) {
	if q.Limit <= 0 {
		q.Limit = DefaultLimit
	}
	q.Limit = min(q.Limit, MaxLimit)
	r := newStreamReader(nc, stream)
	defer r.close()

	// The bounds: from sequence lo up to, not including, hi.
	first, last, err := r.bounds(ctx)
	if err != nil || last == 0 {
		return &Page{Entries: []Entry{}}, err
	}
	lo, hi := first, position{seq: last + 1}
	if q.Before > 0 && (position{q.Before, q.BeforeEntry}).before(hi) {
		hi = position{q.Before, q.BeforeEntry}
	}
	if !q.Until.IsZero() {
		// An entry is stored up to indexLinger after its time (and a
		// worker's clock may run ahead of the server's): the bound reads a
		// little past Until, and Match keeps what came before it.
		s, found, err := r.seqAt(ctx, q.Until.Add(untilSlack))
		if err != nil {
			return nil, err
		}
		if found && s < hi.seq {
			hi = position{seq: s}
		}
	}
	if !q.Since.IsZero() {
		s, found, err := r.seqAt(ctx, q.Since)
		if err != nil {
			return nil, err
		}
		if !found {
			return &Page{Entries: []Entry{}}, nil
		}
		lo = max(lo, s)
	}
	filter := q.subjectFilter(n)
	page := &Page{Entries: []Entry{}}
	seen := map[string]bool{}
	window := uint64(2 * q.Limit)
	for hi.after(lo) && len(page.Entries) < q.Limit {
		from := lo
		if hi.seq-lo > window {
			from = hi.seq - window
		}
		need := q.Limit - len(page.Entries)
		got, scanned, trimmed, err := r.window(ctx, filter, from, hi, need, q)
		if err != nil {
			return nil, err
		}
		page.Scanned += scanned
		// got is oldest first: take from its end.
		for i := len(got) - 1; i >= 0 && len(page.Entries) < q.Limit; i-- {
			e := got[i]
			page.Next, page.NextEntry = e.Seq, e.part
			if seen[e.ExecutionID] {
				continue
			}
			seen[e.ExecutionID] = true
			page.Entries = append(page.Entries, e)
		}
		if len(page.Entries) >= q.Limit {
			break
		}
		if trimmed && len(got) > 0 {
			// More matched than was kept (an execution's entries repeated
			// within it): read the rest of this window again.
			hi = position{got[0].Seq, got[0].part}
			page.Next, page.NextEntry = hi.seq, hi.entry
			continue
		}
		hi = position{seq: from}
		page.Next, page.NextEntry = hi.seq, 0
		if page.Scanned >= maxScanned {
			break
		}
		window *= 4
	}
	if !hi.after(lo) && len(page.Entries) < q.Limit {
		page.Next, page.NextEntry = 0, 0 // read to the start: nothing older
	}
	return page, nil
}

// position is where an entry is in the index: its message's sequence, and
// its place in the message (oldest first). As a bound, position{seq, 0} is
// the start of message seq.
type position struct {
	seq   uint64
	entry int
}

// before reports whether p comes before o.
func (p position) before(o position) bool {
	return p.seq < o.seq || p.seq == o.seq && p.entry < o.entry
}

// after reports whether anything from sequence lo comes before p.
func (p position) after(lo uint64) bool {
	return p.seq > lo || p.seq == lo && p.entry > 0
}

// bounds returns the stream's first and last sequence (0, 0 when empty).
func (r *reader) bounds(ctx context.Context) (first, last uint64, err error) {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	resp, err := r.nc.RequestWithContext(ctx, "$JS.API.STREAM.INFO."+r.stream, nil)
	if err != nil {
		return 0, 0, fmt.Errorf("capstan: stream %s: %w", r.stream, err)
	}
	var info struct {
		State struct {
			Msgs     uint64 `json:"messages"`
			FirstSeq uint64 `json:"first_seq"`
			LastSeq  uint64 `json:"last_seq"`
		} `json:"state"`
		Error *struct {
			Code        int    `json:"code"`
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(resp.Data, &info); err != nil {
		return 0, 0, fmt.Errorf("capstan: stream %s: %w", r.stream, err)
	}
	if info.Error != nil {
		return 0, 0, fmt.Errorf("capstan: stream %s: %d %s", r.stream, info.Error.Code, info.Error.Description)
	}
	if info.State.Msgs == 0 {
		return 0, 0, nil
	}
	return info.State.FirstSeq, info.State.LastSeq, nil
}

// seqAt returns the sequence of the first message stored at or after t;
// found is false when there is none.
func (r *reader) seqAt(ctx context.Context, t time.Time) (uint64, bool, error) {
	t = t.UTC()
	msgs, _, err := r.get(ctx, getRequest{StartTime: &t}, false)
	if err != nil {
		return 0, false, fmt.Errorf("capstan: stream %s: %w", r.stream, err)
	}
	if len(msgs) == 0 {
		return 0, false, nil
	}
	return msgs[0].seq, true, nil
}

// window reads the entries from sequence from up to, not including, hi that
// match filter and q, oldest first, keeping the newest need of them
// (trimmed: more matched), and how many it read.
func (r *reader) window(ctx context.Context, filter string, from uint64, hi position, need int, q Query) (keep []Entry, scanned int, trimmed bool, err error) {
	seq := from
	defer func() {
		if len(keep) > need {
			keep, trimmed = keep[len(keep)-need:], true
		}
	}()
	// A batch costs the server a count of what matches from seq to the
	// stream's end (see reader.get), which for a window deep in the stream
	// walks every block after it: a window is read one match at a time, each
	// get walking only to its match, until it proves dense.
	singles := 0
	for hi.after(seq) {
		batch := singles >= denseAfter
		msgs, more, err := r.get(ctx, getRequest{Seq: seq, NextFor: filter}, batch)
		if !batch {
			singles++
		}
		if err != nil {
			return nil, scanned, false, fmt.Errorf("capstan: read stream %s: %w", r.stream, err)
		}
		for _, m := range msgs {
			if !(position{seq: m.seq}).before(hi) {
				return keep, scanned, trimmed, nil
			}
			seq = m.seq + 1
			entries, err := decodeEntries(m.data)
			if err != nil {
				scanned++
				continue // not an entry this version reads
			}
			for _, e := range entries {
				e.Seq = m.seq
				if !(position{e.Seq, e.part}).before(hi) {
					break
				}
				scanned++
				if !q.Match(&e) {
					continue
				}
				keep = append(keep, e)
			}
			if len(keep) > 4*need {
				keep, trimmed = append(keep[:0], keep[len(keep)-need:]...), true
			}
		}
		if !more || len(msgs) == 0 {
			break
		}
	}
	return keep, scanned, trimmed, nil
}
