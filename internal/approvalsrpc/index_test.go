package approvalsrpc_test

import (
	"errors"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/approvalsrpc"
	"github.com/capstan-dev/capstan/internal/approvalstore"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// pendingOfPrincipal creates a pending approval requested under principal,
// expiring after ttl.
func pendingOfPrincipal(t *testing.T, s *approvalstore.Store, principal string, ttl time.Duration) *approvals.Record {
	t.Helper()
	input, hash, err := approvalstore.Canonical(envelope.MustRaw(map[string]any{"amount": 501}))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	r := &approvals.Record{ID: envelope.NewExecutionID(), CapabilityID: "orders.refund", Actor: alice, Input: input, InputHash: hash,
		Types: []string{"finance"}, RequestedBy: envelope.NewExecutionID(), Principal: principal, RequestedAt: now, ExpiresAt: now.Add(ttl)}
	if err := s.Create(ctxT(t), r); err != nil {
		t.Fatal(err)
	}
	return r
}

// waitPending waits until the index counts want pending approvals of
// principal at at: the watcher brings what another process wrote.
func waitPending(t *testing.T, x *approvalsrpc.Index, principal string, at time.Time, want int) {
	t.Helper()
	ctx := ctxT(t)
	for {
		if n, _ := x.Pending(principal, at); n == want {
			return
		}
		select {
		case <-ctx.Done():
			n, _ := x.Pending(principal, at)
			t.Fatalf("%s has %d pending in the index, want %d", principal, n, want)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// The index counts a principal's pending approvals, whoever wrote them: a
// decided or expired one no longer counts, another principal's never does;
// Reserve refuses one more at the quota, with when the first expires, and
// counts the creations under way in this process.
func TestIndex_CountsAPrincipalsPendingApprovals(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	s, b := storeOn(t, env.Connect(t))
	early := pendingOfPrincipal(t, s, "alice", time.Hour)
	x, err := approvalsrpc.WatchIndex(ctxT(t), b.Approvals, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(x.Stop)
	waitPending(t, x, "alice", early.RequestedAt, 1)

	pendingOfPrincipal(t, s, "alice", 2*time.Hour)
	short := pendingOfPrincipal(t, s, "alice", 5*time.Minute)
	pendingOfPrincipal(t, s, "bob", time.Hour)
	now := short.RequestedAt
	waitPending(t, x, "alice", now, 3)
	waitPending(t, x, "bob", now, 1)

	// At a quota of 3 she is refused, told to come back when the first expires.
	if _, wait, err := x.Reserve("alice", 3, now); !errors.Is(err, approvalsrpc.ErrOverQuota) || wait != 5*time.Minute {
		t.Fatalf("alice at her quota: wait %v, %v", wait, err)
	}
	// Once the short one expired, she has room for one, held by a reservation.
	later := short.ExpiresAt
	release, _, err := x.Reserve("alice", 3, later)
	if err != nil {
		t.Fatalf("alice under her quota: %v", err)
	}
	if _, _, err := x.Reserve("alice", 3, later); !errors.Is(err, approvalsrpc.ErrOverQuota) {
		t.Fatalf("a reservation under way did not count: %v", err)
	}
	release()
	release() // once is enough
	if _, _, err := x.Reserve("bob", 1, later); !errors.Is(err, approvalsrpc.ErrOverQuota) {
		t.Fatalf("bob at his quota of 1: %v", err)
	}
	// A decision frees one.
	approve(t, s, early.ID)
	waitPending(t, x, "alice", later, 1)
	if _, _, err := x.Reserve("alice", 2, later); err != nil {
		t.Fatalf("alice after a decision: %v", err)
	}
	if got := x.Select(func(r *approvals.Record) bool { return r.ID == short.ID }); len(got) != 1 || got[0].Input != nil {
		t.Fatalf("the index keeps %v of an expired approval, want it without its input", got)
	}
}
