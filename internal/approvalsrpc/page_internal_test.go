package approvalsrpc

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/envelope"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// recs makes n pending approvals of principal, one a millisecond from at.
func recs(principal string, n int, at time.Time) []*approvals.Record {
	var out []*approvals.Record
	for i := range n {
		out = append(out, &approvals.Record{V: 1, ID: fmt.Sprintf("%s-%04d", principal, i), Principal: principal, CapabilityID: "orders.refund",
			Actor: envelope.Actor{Kind: "user", ID: principal}, Input: []byte(`{"amount":501}`), Status: approvals.StatusPending,
			RequestedAt: at.Add(time.Duration(i) * time.Millisecond), ExpiresAt: at.Add(time.Hour), RequestedBy: "e-" + principal})
	}
	return out
}

// pages lists all of recs with limit and maxBytes, page by page, as the
// workers would; drop removes records between pages (decided since).
func pages(t *testing.T, all []*approvals.Record, limit, maxBytes int, newest bool, between func(page int, all []*approvals.Record) []*approvals.Record) [][]string {
	t.Helper()
	var out [][]string
	cur := ""
	for p := 0; ; p++ {
		if p > 10_000 {
			t.Fatal("the listing never ends")
		}
		c, err := decodeCursor(cur, newest)
		if err != nil {
			t.Fatal(err)
		}
		reply := &approvals.ListReply{V: 1, Records: []*approvals.Record{}}
		if err := fill(reply, newTurns(all, c), limit, maxBytes, func(r *approvals.Record) (*approvals.Record, bool, error) { return r, true, nil }); err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, r := range reply.Records {
			ids = append(ids, r.ID)
		}
		out = append(out, ids)
		if reply.Next == "" {
			return out
		}
		if len(reply.Records) == 0 {
			t.Fatalf("page %d is empty but says more follows", p)
		}
		cur = reply.Next
		if between != nil {
			all = between(p, all)
		}
	}
}

// However many approvals alice has, bob's and carol's are on the first page
// beside hers: the requesters take turns.
func TestPage_RequestersTakeTurns(t *testing.T) {
	t.Parallel()
	all := append(recs("alice", 3000, t0), recs("bob", 1, t0.Add(time.Hour))...)
	all = append(all, recs("carol", 2, t0.Add(-time.Hour))...)
	got := pages(t, all, 5, 0, false, nil)
	want := []string{"alice-0000", "bob-0000", "carol-0000", "alice-0001", "carol-0001"}
	if fmt.Sprint(got[0]) != fmt.Sprint(want) {
		t.Fatalf("first page %v, want %v", got[0], want)
	}
	if fmt.Sprint(got[1]) != fmt.Sprint([]string{"alice-0002", "alice-0003", "alice-0004", "alice-0005", "alice-0006"}) {
		t.Fatalf("second page %v", got[1])
	}
	assertEachOnce(t, got, all)
}

// Newest first: each requester's newest first, still in turns.
func TestPage_NewestFirst(t *testing.T) {
	t.Parallel()
	all := append(recs("alice", 10, t0), recs("bob", 2, t0)...)
	got := pages(t, all, 4, 0, true, nil)
	want := []string{"alice-0009", "bob-0001", "alice-0008", "bob-0000"}
	if fmt.Sprint(got[0]) != fmt.Sprint(want) {
		t.Fatalf("first page %v, want %v", got[0], want)
	}
	assertEachOnce(t, got, all)
	if _, err := decodeCursor(pagesCursor(t, all, false), true); !errors.Is(err, approvals.ErrInvalid) {
		t.Fatalf("an oldest-first cursor read newest first: %v", err)
	}
}

func pagesCursor(t *testing.T, all []*approvals.Record, newest bool) string {
	t.Helper()
	c, _ := decodeCursor("", newest)
	reply := &approvals.ListReply{}
	if err := fill(reply, newTurns(all, c), 1, 0, func(r *approvals.Record) (*approvals.Record, bool, error) { return r, true, nil }); err != nil {
		t.Fatal(err)
	}
	return reply.Next
}

// A cursor is a position, not an offset: approvals decided (gone from a
// pending listing) or added between two pages make nothing else skipped or
// listed twice.
func TestPage_CursorIsAPosition(t *testing.T) {
	t.Parallel()
	all := append(recs("alice", 40, t0), recs("bob", 40, t0)...)
	got := pages(t, all, 7, 0, false, func(page int, all []*approvals.Record) []*approvals.Record {
		// The oldest of each, listed already, are decided; and a newer one
		// of bob's arrives.
		out := slices.DeleteFunc(slices.Clone(all), func(r *approvals.Record) bool {
			return r.ID == fmt.Sprintf("alice-%04d", page) || r.ID == fmt.Sprintf("bob-%04d", page)
		})
		return append(out, &approvals.Record{ID: fmt.Sprintf("bob-new-%02d", page), Principal: "bob", RequestedAt: t0.Add(time.Hour + time.Duration(page))})
	})
	seen := map[string]int{}
	for _, p := range got {
		for _, id := range p {
			seen[id]++
		}
	}
	for i := range 40 {
		for _, p := range []string{"alice", "bob"} {
			if id := fmt.Sprintf("%s-%04d", p, i); seen[id] != 1 {
				t.Errorf("%s listed %d times", id, seen[id])
			}
		}
	}
	for id, n := range seen {
		if n != 1 {
			t.Errorf("%s listed %d times", id, n)
		}
	}
	if !strings.Contains(fmt.Sprint(got), "bob-new-") {
		t.Error("approvals added while paging were never listed")
	}
}

// A page ends before a record that would make the reply exceed its bound,
// and the next page begins with it; a record too large alone goes without
// its input, and says so.
func TestPage_CutToTheBytes(t *testing.T) {
	t.Parallel()
	all := recs("alice", 30, t0)
	for _, r := range all {
		r.Input = []byte(`{"note":"` + strings.Repeat("x", 1000) + `"}`)
	}
	one, _ := encodedLen(all[0])
	bound := 4*one + 600 // four records and the reply around them, not five
	got := pages(t, all, 50, bound, false, nil)
	for i, p := range got {
		if len(p) > 4 || len(p) < 1 {
			t.Fatalf("page %d holds %d records, want 1 to 4 within %d bytes", i, len(p), bound)
		}
	}
	assertEachOnce(t, got, all)

	huge := recs("bob", 2, t0)
	huge[0].Input = []byte(`{"note":"` + strings.Repeat("y", 10_000) + `"}`)
	c, _ := decodeCursor("", false)
	reply := &approvals.ListReply{Records: []*approvals.Record{}}
	if err := fill(reply, newTurns(huge, c), 50, 2000, func(r *approvals.Record) (*approvals.Record, bool, error) { return r, true, nil }); err != nil {
		t.Fatal(err)
	}
	if len(reply.Records) != 2 || reply.Records[0].Input != nil || reply.Records[1].Input == nil || fmt.Sprint(reply.Trimmed) != "[bob-0000]" {
		t.Fatalf("a record too large alone: %d records, trimmed %v", len(reply.Records), reply.Trimmed)
	}
	b, _ := envelope.Marshal(reply)
	if len(b) > 2000 {
		t.Fatalf("the reply is %d bytes, over its bound", len(b))
	}
}

func TestPage_ACursorNotOfTheListingIsRefused(t *testing.T) {
	t.Parallel()
	for _, c := range []string{"o12", "!!", "eyJwIjp7ImFsaWNlIjoieCJ9fQ"} {
		if _, err := decodeCursor(c, false); !errors.Is(err, approvals.ErrInvalid) {
			t.Errorf("cursor %q: %v, want approvals.ErrInvalid", c, err)
		}
	}
}

func assertEachOnce(t *testing.T, got [][]string, all []*approvals.Record) {
	t.Helper()
	seen := map[string]int{}
	for _, p := range got {
		for _, id := range p {
			seen[id]++
		}
	}
	for _, r := range all {
		if seen[r.ID] != 1 {
			t.Errorf("%s listed %d times", r.ID, seen[r.ID])
		}
	}
	if len(seen) != len(all) {
		t.Errorf("listed %d distinct, want %d", len(seen), len(all))
	}
}
