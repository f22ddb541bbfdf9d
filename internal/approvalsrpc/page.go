package approvalsrpc

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/approvalstore"
)

// The order of a listing (DESIGN §7 "Listing approvals"): each requesting
// principal's approvals oldest first (newest first when asked), and the
// principals taking turns, one approval each, in the order of their names,
// so that however many approvals one principal has, the others' are on the
// first page beside them. A cursor says where each principal's approvals
// stand and whose turn is next; it holds a position, not an offset, so that
// approvals decided or added between two pages move nothing else.

// cursor is where a listing goes on.
type cursor struct {
	// After is the principal whose approval ended the page: the turns go on
	// with the next one.
	After string `json:"a"`
	// At is, per principal, its last approval listed: requestedAt in Unix
	// nanoseconds, a dot, the approval id.
	At map[string]string `json:"p,omitempty"`
	// Newest is the order the cursor was made for.
	Newest bool `json:"n,omitempty"`
}

func (c cursor) encode() string {
	b, _ := json.Marshal(c)
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeCursor(s string, newest bool) (cursor, error) {
	if s == "" {
		return cursor{At: map[string]string{}, Newest: newest}, nil
	}
	var c cursor
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err == nil {
		err = json.Unmarshal(b, &c)
	}
	if err == nil && c.Newest != newest {
		err = fmt.Errorf("made for the other order")
	}
	if err == nil {
		for _, pos := range c.At {
			if _, _, perr := splitPos(pos); perr != nil {
				err = perr
				break
			}
		}
	}
	if err != nil {
		return cursor{}, fmt.Errorf("%w: cursor %q is not one of this listing's: %v", approvals.ErrInvalid, s, err)
	}
	if c.At == nil {
		c.At = map[string]string{}
	}
	return c, nil
}

func posOf(r *approvals.Record) string {
	return strconv.FormatInt(r.RequestedAt.UnixNano(), 10) + "." + r.ID
}

func splitPos(pos string) (time.Time, string, error) {
	ns, id, ok := strings.Cut(pos, ".")
	n, err := strconv.ParseInt(ns, 10, 64)
	if !ok || err != nil {
		return time.Time{}, "", fmt.Errorf("position %q", pos)
	}
	return time.Unix(0, n).UTC(), id, nil
}

// older orders records by when they were requested, then by id.
func older(a, b *approvals.Record) int {
	if c := a.RequestedAt.Compare(b.RequestedAt); c != 0 {
		return c
	}
	return cmp.Compare(a.ID, b.ID)
}

// turns hands out a listing's records in its order.
type turns struct {
	c      cursor
	names  []string                       // the requesting principals, sorted
	queues map[string][]*approvals.Record // each one's records still to list, in order
	next   int                            // index in names of the next turn
	// last undoes the last take.
	last struct {
		principal, pos, after string
		next                  int
		r                     *approvals.Record
	}
}

// newTurns arranges recs (any order) for a listing that goes on from c.
func newTurns(recs []*approvals.Record, c cursor) *turns {
	t := &turns{c: c, queues: map[string][]*approvals.Record{}}
	for _, r := range recs {
		if pos, ok := c.At[r.Principal]; ok {
			at, id, _ := splitPos(pos)
			d := older(r, &approvals.Record{RequestedAt: at, ID: id})
			if (!c.Newest && d <= 0) || (c.Newest && d >= 0) {
				continue // listed on an earlier page
			}
		}
		t.queues[r.Principal] = append(t.queues[r.Principal], r)
	}
	for p, q := range t.queues {
		slices.SortFunc(q, older)
		if c.Newest {
			slices.Reverse(q)
		}
		t.names = append(t.names, p)
	}
	slices.Sort(t.names)
	if _, served := c.At[c.After]; served {
		i, found := slices.BinarySearch(t.names, c.After)
		if found {
			i++
		}
		t.next = i % max(len(t.names), 1)
	}
	return t
}

// take returns the next record in the listing's order, or nil.
func (t *turns) take() *approvals.Record {
	for range t.names {
		p := t.names[t.next]
		prev := t.next
		t.next = (t.next + 1) % len(t.names)
		q := t.queues[p]
		if len(q) == 0 {
			continue
		}
		r := q[0]
		t.queues[p] = q[1:]
		t.last.principal, t.last.pos, t.last.after, t.last.next, t.last.r = p, t.c.At[p], t.c.After, prev, r
		t.c.At[p], t.c.After = posOf(r), p
		return r
	}
	return nil
}

// untake puts back the record the last take returned.
func (t *turns) untake() {
	p := t.last.principal
	t.queues[p] = append([]*approvals.Record{t.last.r}, t.queues[p]...)
	if t.last.pos == "" {
		delete(t.c.At, p)
	} else {
		t.c.At[p] = t.last.pos
	}
	t.c.After, t.next = t.last.after, t.last.next
}

// more reports whether records are left to list.
func (t *turns) more() bool {
	for _, q := range t.queues {
		if len(q) > 0 {
			return true
		}
	}
	return false
}

// PageAs returns one page of the approvals principal may see (those of
// types it may decide, see Authorizer, and those requested under principal
// itself), as req selects them, in the listing's order (see approvals.ListRequest),
// and within maxBytes once encoded (0: no bound): a page that would be
// larger ends early, with the cursor of the rest; a record too large alone
// is sent without its input and display (approvals.ListReply.Trimmed). req.ID asks
// for one approval.
func PageAs(ctx context.Context, s *approvalstore.Store, x *Index, principal string, req approvals.ListRequest, authz Authorizer, maxBytes int) (*approvals.ListReply, error) {
	reply := &approvals.ListReply{V: envelope.Version, Records: []*approvals.Record{}}
	if req.ID != "" {
		recs, err := ListAs(ctx, s, principal, approvals.ListRequest{ID: req.ID}, authz)
		if err != nil {
			return nil, err
		}
		t := newTurns(recs, cursor{At: map[string]string{}})
		return reply, fill(reply, t, 1, maxBytes, func(r *approvals.Record) (*approvals.Record, bool, error) { return r, true, nil })
	}
	if req.Decided && req.Status != "" {
		return nil, fmt.Errorf("%w: a listing asks for decided approvals or for a status, not both", approvals.ErrInvalid)
	}
	limit := req.Limit
	if limit <= 0 {
		limit = DefaultPageSize
	}
	limit = min(limit, MaxPageSize)
	c, err := decodeCursor(req.Cursor, req.Newest)
	if err != nil {
		return nil, err
	}
	now := time.Now().UTC()
	matches := func(r *approvals.Record) bool {
		st := r.StatusAt(now)
		if req.Status != "" && st != req.Status || req.Decided && st == approvals.StatusPending ||
			req.CapabilityID != "" && r.CapabilityID != req.CapabilityID ||
			req.Actor.Kind+req.Actor.ID != "" && !(req.Actor.Kind == r.Actor.Kind && req.Actor.ID == r.Actor.ID) {
			return false
		}
		if requestedBy(r, principal) {
			return true
		}
		_, _, err := authz.Approver(principal, r.Types)
		return err == nil
	}
	var recs []*approvals.Record
	load := func(r *approvals.Record) (*approvals.Record, bool, error) { return shownTo(r, principal), true, nil }
	if x != nil {
		// What was written before the listing is in it, whoever wrote it;
		// an index that cannot tell lists what it has.
		sctx, cancel := context.WithTimeout(ctx, syncWait)
		_ = x.Sync(sctx)
		cancel()
		recs = x.Select(matches)
		load = func(r *approvals.Record) (*approvals.Record, bool, error) {
			full, err := s.Get(ctx, r.ID)
			switch {
			case errors.Is(err, approvals.ErrNotFound), errors.Is(err, envelope.ErrDecode):
				return nil, false, nil // gone since, or not a record: not listed
			case err != nil:
				return nil, false, err
			}
			if !matches(full) {
				return nil, false, nil // changed since the index saw it
			}
			return shownTo(full, principal), true, nil
		}
	} else {
		all, err := s.List(ctx, approvalstore.Filter{})
		if err != nil {
			return nil, err
		}
		for _, r := range all {
			if matches(r) {
				recs = append(recs, r)
			}
		}
	}
	return reply, fill(reply, newTurns(recs, c), limit, maxBytes, load)
}

// syncWait bounds how long a listing waits for the index to catch up.
const syncWait = 2 * time.Second

// replySlack covers what a reply holds besides its records and cursor: its
// keys, its version, the arrays' and strings' headers.
const replySlack = 128

// fill puts in reply the records t hands out, at most limit, loaded by load
// (false: no longer listed), while the encoded reply stays within maxBytes
// (0: no bound), and the cursor of what is left.
func fill(reply *approvals.ListReply, t *turns, limit, maxBytes int, load func(*approvals.Record) (*approvals.Record, bool, error)) error {
	used := replySlack
	for len(reply.Records) < limit {
		r := t.take()
		if r == nil {
			break
		}
		rec, ok, err := load(r)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		size, err := encodedLen(rec)
		if err != nil {
			return err
		}
		if maxBytes > 0 && used+size+len(t.c.encode())+len(rec.ID) > maxBytes {
			if len(reply.Records) > 0 {
				t.untake() // the next page's first
				break
			}
			trimmed := *rec
			trimmed.Input, trimmed.Display = nil, nil
			rec, reply.Trimmed = &trimmed, append(reply.Trimmed, rec.ID)
			if size, err = encodedLen(rec); err != nil {
				return err
			}
		}
		reply.Records = append(reply.Records, rec)
		used += size
	}
	if t.more() {
		reply.Next = t.c.encode()
	}
	return nil
}

func encodedLen(r *approvals.Record) (int, error) {
	b, err := envelope.Marshal(r)
	return len(b), err
}
