package broker_test

import (
	"testing"
	"time"

	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// Each pool's backlog counts what its filter matches, and its oldest request
// is the first one stored that its workers have not acknowledged; a pool
// with nothing waiting has no oldest request.
func TestBacklogs_PendingAndOldestPerPool(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	b := provision(t, env.Connect(t), broker.Config{})
	ctx := testCtx(t)
	if _, err := b.EnsurePool(ctx, broker.PoolConfig{Pool: "a", Capabilities: []string{"x.one", "x.two"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.EnsurePool(ctx, broker.PoolConfig{Pool: "b", Capabilities: []string{"y.one"}}); err != nil {
		t.Fatal(err)
	}
	for _, capID := range []string{"x.two", "x.one"} {
		if _, err := b.JS.Publish(ctx, b.Names.ExecSubject(broker.Anonymous, capID), []byte("request")); err != nil {
			t.Fatal(err)
		}
	}
	first, err := b.Exec.GetMsg(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}

	// A consumer counts a stored request a moment after the stream
	// acknowledged it: read until pool a has counted both.
	got := map[string]broker.Backlog{}
	for got["a"].Pending < 2 {
		backlogs, err := b.Backlogs(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, bl := range backlogs {
			got[bl.Pool] = bl
		}
		select {
		case <-ctx.Done():
			t.Fatalf("pool a never counted its requests: %+v", got)
		case <-time.After(10 * time.Millisecond):
		}
	}
	if a := got["a"]; a.Pending != 2 || a.AckPending != 0 || !a.Oldest.Equal(first.Time) {
		t.Errorf("pool a: %+v, want 2 pending, the oldest stored at %v", a, first.Time)
	}
	if bb, ok := got["b"]; !ok || bb.Pending != 0 || !bb.Oldest.Equal(time.Time{}) {
		t.Errorf("pool b: %+v (listed %v), want nothing waiting", bb, ok)
	}
}
