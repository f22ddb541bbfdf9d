package auth_test

import (
	"github.com/capstan-dev/capstan/audit"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/internal/broker"
)

// Requests waiting at a limit file an audit event at every delivery, about
// every 2 s each, for as long as they wait: bob grows the shared audit stream without bound.
func TestTenant_WaitingAtALimitFilesBoundedEvents(t *testing.T) {
	r := newTenantRig(t, embedded, broker.Config{})
	ctx := testCtx(t)
	bob, _ := r.client(t, "bob")
	holder, err := bob.Submit(ctx, "t.spend", SpendInput{Amount: 1, HoldMs: 60000})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "bob's holder runs", func() bool {
		ev := waitTrailTypes(t, r, "bob", holder)
		for _, e := range ev {
			if e == audit.EventStarted {
				return true
			}
		}
		return false
	})
	const waiters = 200
	for range waiters {
		if _, err := bob.Submit(ctx, "t.spend", SpendInput{Amount: 0, HoldMs: 1}); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(5 * time.Second)
	info, err := r.admin.Audit.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	before := info.State.Msgs
	const span = 20 * time.Second
	time.Sleep(span)
	info, err = r.admin.Audit.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	after := info.State.Msgs
	t.Logf("audit messages filed in %v while %d of bob's requests wait at his actor's limit: %d", span, waiters, after-before)
	if after-before > waiters {
		t.Errorf("%d waiting requests filed %d audit messages in %v: waiting grows the shared audit stream without bound", waiters, after-before, span)
	}
}

func waitTrailTypes(t *testing.T, r *tenantRig, principal, id string) []string {
	t.Helper()
	evs, err := audit.Read(testCtx(t), r.admin.NC, r.admin.Names.Prefix(), principal, id)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range evs {
		out = append(out, e.Type)
	}
	return out
}
