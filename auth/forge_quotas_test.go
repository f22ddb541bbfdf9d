package auth_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/auth"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/approvalsrpc"
	"github.com/capstan-dev/capstan/internal/broker"
)

// Quotas under attack (DESIGN §12 "Quotas"), with the principals' real
// credentials: alice floods the workers with control requests (listings
// that match nothing and read deep, describes, probes) and the approvers'
// inbox with refunds that each need an approval. She is refused beyond her
// quotas, with QUOTA_EXCEEDED and the figures; bob's listings, describes and
// probes keep answering during her flood; the trail grows by one event of
// hers however many describes she makes; carol's inbox answers in pages no
// larger than her account may receive, bob's approval on the first; and
// nothing of bob's changed. The workers' clock for control quotas stands
// still, so every figure is a count: alice has her burst of 20 and no more.

const (
	floodControlQuota = 20
	floodPendingQuota = 40
	floodRefunds      = 600
	carolPayload      = 8 << 10
)

func TestForge_FloodsCostAliceAlone(t *testing.T) {
	t.Parallel()
	testFloods(t, newFloodRig(t, embedded))
}

func TestForgeOnOfficialServer_FloodsCostAliceAlone(t *testing.T) {
	t.Parallel()
	testFloods(t, newFloodRig(t, official))
}

// newFloodRig is a rig where alice's quotas are small, carol's account may
// receive 8 KiB messages, and the worker's control clock stands still.
func newFloodRig(t *testing.T, d deployment) *rig {
	t.Helper()
	frozen := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	return newRigWith(t, d, func(r *rig) {
		q := auth.DefaultQuotas
		q.ControlPerSecond, q.PendingApprovals = floodControlQuota, floodPendingQuota
		if err := r.setup.Set("alice", nil, &q); err != nil {
			t.Fatal(err)
		}
		l := auth.DefaultLimits
		l.Payload = carolPayload
		if err := r.setup.Set("carol", &l, nil); err != nil {
			t.Fatal(err)
		}
		r.knobs.ControlClock = func() time.Time { return frozen }
	})
}

// bobsState is every key of bob's in the records and envelopes buckets, with
// its revision, and his approval's.
func (r *rig) bobsState(t *testing.T, approvalID string) map[string]uint64 {
	t.Helper()
	ctx := testCtx(t)
	out := map[string]uint64{}
	for name, kv := range map[string]jetstream.KeyValue{"envelopes": r.admin.Envelopes, "executions": r.admin.Executions} {
		keys, err := kv.ListKeys(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for k := range keys.Keys() {
			if !strings.HasPrefix(k, "bob.") {
				continue
			}
			e, err := kv.Get(ctx, k)
			if err != nil {
				t.Fatal(err)
			}
			out[name+"/"+k] = e.Revision()
		}
	}
	e, err := r.admin.Approvals.Get(ctx, approvalID)
	if err != nil {
		t.Fatal(err)
	}
	out["approvals/"+approvalID] = e.Revision()
	return out
}

func testFloods(t *testing.T, r *rig) {
	// A deadline against a hang, not a measure: the floods are over a
	// thousand requests, and a loaded machine takes minutes for them.
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	n := broker.NewNames(r.setup.Prefix)
	bob, _, _ := r.client(t, "bob", executor.SurfaceDirect)
	alice, _, _ := r.client(t, "alice", executor.SurfaceDirect)
	carolNC := r.connect(t, "carol")

	// Bob's before: a refund waiting for finance, an echo that ran.
	asked, err := bob.Call(ctx, "t.refund", Refund{OrderID: "bob-1", Amount: 501})
	if err != nil || asked.Status != envelope.StatusApprovalRequired {
		t.Fatalf("bob's refund: %v %+v", err, asked)
	}
	echo, err := bob.Call(ctx, "t.echo", Echo{Text: "bob"})
	if err != nil || echo.Status != envelope.StatusCompleted {
		t.Fatalf("bob's echo: %v %+v", err, echo)
	}
	r.settled(t, "bob", asked.ExecutionID)
	r.settled(t, "bob", echo.ExecutionID)
	r.acked(t, "bob")
	// The index lists an execution up to 250 ms after it ended (DESIGN §3).
	for {
		page, err := bob.Executions(ctx, executor.ExecutionsRequest{})
		if err == nil && slices.ContainsFunc(page.Entries, func(e audit.Entry) bool { return e.ExecutionID == echo.ExecutionID }) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("bob's echo never listed: %v", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
	bobBefore := r.bobsState(t, asked.Approval.ID)
	auditBefore := auditMsgs(t, r)

	// 1. The control flood: ten describes, then 400 requests at once.
	aliceRequests := []func() error{
		func() error { // a listing that matches nothing and reads deep
			_, err := alice.Executions(ctx, executor.ExecutionsRequest{Query: audit.Query{IDPrefix: "ffffffff", Limit: 500}})
			return err
		},
		func() error {
			_, err := alice.Describe(ctx, "", envelope.Actor{}, executor.Scope{})
			return err
		},
		func() error {
			_, err := alice.Execution(ctx, executor.ExecutionRequest{ExecutionID: envelope.NewExecutionID(), Probe: true})
			return err
		},
	}
	var mu sync.Mutex
	served, refused, describesServed := 0, 0, 0
	var failures []error
	count := func(kind int, err error) {
		mu.Lock()
		defer mu.Unlock()
		var cerr *envelope.CapabilityError
		switch {
		case err == nil:
			served++
			if kind == 1 {
				describesServed++
			}
		case errors.Is(err, envelope.ErrQuotaExceeded) && errors.As(err, &cerr) &&
			fmt.Sprint(cerr.Details["quota"]) == envelope.QuotaControlPerSecond && fmt.Sprint(cerr.Details["limit"]) == fmt.Sprint(floodControlQuota):
			refused++
		default:
			failures = append(failures, err)
		}
	}
	for range 10 {
		count(1, aliceRequests[1]())
	}
	var flood, bobs sync.WaitGroup
	for g := range 16 {
		flood.Add(1)
		go func() {
			defer flood.Done()
			for i := range 25 {
				k := (g + i) % len(aliceRequests)
				count(k, aliceRequests[k]())
			}
		}()
	}
	// Bob, meanwhile: listings, describes, probes, every one answered.
	var bobFailures []error
	bobs.Add(1)
	go func() {
		defer bobs.Done()
		fail := func(err error) { mu.Lock(); bobFailures = append(bobFailures, err); mu.Unlock() }
		for range 5 {
			page, err := bob.Executions(ctx, executor.ExecutionsRequest{})
			if err != nil || !slices.ContainsFunc(page.Entries, func(e audit.Entry) bool { return e.ExecutionID == echo.ExecutionID }) {
				fail(fmt.Errorf("bob's listing: %v %+v", err, page))
			}
			if d, err := bob.Describe(ctx, "", envelope.Actor{}, executor.Scope{}); err != nil || len(d.Capabilities) == 0 {
				fail(fmt.Errorf("bob's describe: %v %+v", err, d))
			}
			if v, err := bob.Execution(ctx, executor.ExecutionRequest{ExecutionID: echo.ExecutionID, Probe: true}); err != nil || v.State == executor.ExecUnknown {
				fail(fmt.Errorf("bob's probe: %v %+v", err, v))
			}
		}
	}()
	flood.Wait()
	bobs.Wait()
	if len(failures) > 0 || len(bobFailures) > 0 {
		t.Fatalf("unanswered or failed: alice's %v; bob's %v", failures, bobFailures)
	}
	if served != floodControlQuota || refused != 410-floodControlQuota {
		t.Fatalf("alice was served %d and refused %d of 410 requests, want her quota of %d served", served, refused, floodControlQuota)
	}
	// The trail: alice's first describe and bob's, and nothing else,
	// although alice was served more describes than that.
	waitAuditMsgs(t, r, auditBefore+2)
	if grew := auditMsgs(t, r) - auditBefore; grew != 2 || describesServed < 10 {
		t.Fatalf("the audit stream grew by %d messages for %d describes of alice's served and 5 of bob's, want 2", grew, describesServed)
	}

	// 2. The inbox flood: 600 refunds that each need an approval.
	var submitted []string
	for i := range floodRefunds {
		id, err := alice.Submit(ctx, "t.refund", Refund{OrderID: fmt.Sprint("a-", i), Amount: 501})
		if err != nil {
			t.Fatalf("alice's refund %d: %v", i, err)
		}
		submitted = append(submitted, id)
	}
	pending, over := 0, 0
	for _, id := range submitted {
		env, err := alice.Await(ctx, id)
		switch {
		case err != nil:
			t.Fatalf("alice's refund %s: %v", id, err)
		case env.Status == envelope.StatusApprovalRequired:
			pending++
		case env.Error != nil && env.Error.Code == envelope.CodeQuotaExceeded &&
			fmt.Sprint(env.ForModel().Details["quota"]) == envelope.QuotaPendingApprovals:
			over++
		default:
			t.Fatalf("alice's refund %s: %+v", id, env)
		}
	}
	if pending != floodPendingQuota || over != floodRefunds-floodPendingQuota {
		t.Fatalf("alice's refunds: %d pending, %d refused, want %d pending", pending, over, floodPendingQuota)
	}
	r.acked(t, "alice")

	// 3. Carol's inbox answers, in pages within what her account may
	// receive, bob's approval on the first.
	var listed []string
	pages := 0
	for cur := ""; ; pages++ {
		if pages > 100 {
			t.Fatal("carol's listing never ends")
		}
		body, err := envelope.Marshal(&approvals.ListRequest{V: envelope.Version, Status: approvals.StatusPending, Limit: approvalsrpc.MaxPageSize, Cursor: cur})
		if err != nil {
			t.Fatal(err)
		}
		m, err := carolNC.RequestWithContext(ctx, n.ListApprovalsSubject("carol"), body)
		if err != nil {
			t.Fatalf("carol's page %d: %v", pages, err)
		}
		if len(m.Data) > carolPayload {
			t.Fatalf("carol's page %d is %d bytes, over the %d her account may receive", pages, len(m.Data), carolPayload)
		}
		var page approvals.ListReply
		if err := envelope.Unmarshal(m.Data, &page); err != nil || page.Error != "" {
			t.Fatalf("carol's page %d: %v %s", pages, err, page.Error)
		}
		for _, rec := range page.Records {
			listed = append(listed, rec.ID)
		}
		if pages == 0 && !slices.Contains(listed, asked.Approval.ID) {
			t.Fatalf("bob's approval is not on carol's first page (%d of alice's are)", len(listed))
		}
		if page.Next == "" {
			break
		}
		cur = page.Next
	}
	if pages < 2 || len(listed) != floodPendingQuota+1 {
		t.Fatalf("carol listed %d approvals in %d pages, want %d in several", len(listed), pages+1, floodPendingQuota+1)
	}
	slices.Sort(listed)
	if len(slices.Compact(listed)) != floodPendingQuota+1 {
		t.Fatal("carol's pages list an approval twice")
	}

	// 4. Nothing of bob's changed, and he goes on.
	if after := r.bobsState(t, asked.Approval.ID); fmt.Sprint(after) != fmt.Sprint(bobBefore) {
		t.Fatalf("bob's state changed:\n%v\nwas\n%v", after, bobBefore)
	}
	if _, err := approvalsrpc.Decide(ctx, carolNC, n, approvalsrpc.DecideRequest{ApprovalID: asked.Approval.ID, Approve: true}); err != nil {
		t.Fatalf("carol deciding bob's approval: %v", err)
	}
	if env, err := bob.Resume(ctx, asked.Approval.ID); err != nil || env.Status != envelope.StatusCompleted {
		t.Fatalf("bob's resume: %v %+v", err, env)
	}
	if got := r.refunds.Load(); got != 1 {
		t.Fatalf("refunds made: %d, want bob's one", got)
	}
}

func auditMsgs(t *testing.T, r *rig) uint64 {
	t.Helper()
	info, err := r.admin.Audit.Info(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

func waitAuditMsgs(t *testing.T, r *rig, want uint64) {
	t.Helper()
	ctx := testCtx(t)
	for auditMsgs(t, r) < want {
		select {
		case <-ctx.Done():
			t.Fatalf("the audit stream holds %d messages, want %d", auditMsgs(t, r), want)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
