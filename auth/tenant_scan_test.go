package auth_test

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
)

// A producer's reading of an execution by an id it chose (not a UUIDv7,
// which says when to read from) costs a few gets of the audit stream, not
// one for every message of the id's shard since the stream began: bob,
// asking fifty times a second for "x1", which names nothing, made a worker
// walk every other execution's events there, and so does his reading of
// "x2", which ran, begun long after its shard filled.
func TestTenant_ReadingAChosenIDCostsBoundedGets(t *testing.T) {
	t.Parallel()
	r := newTenantRig(t, embedded, broker.Config{})
	ctx := testCtx(t)
	bob, _ := r.client(t, "bob")
	n := r.admin.Names
	const filler = 5000
	for _, key := range []string{"bob.x1", "x1", "bob.x2", "x2"} {
		for i := range filler / 2 {
			m := nats.NewMsg(n.AuditSubject(key))
			m.Header.Set(broker.AuditExecutionHeader, fmt.Sprintf("carol.other%d", i))
			m.Data = []byte("x")
			if err := r.admin.NC.PublishMsg(m); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := r.admin.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	// The shards filled before x2 began, by more than a reading's slack
	// for clocks apart.
	time.Sleep(6 * time.Second)
	if env, err := bob.Call(ctx, "demo.echo", map[string]any{"x": 2}, executor.WithID("x2")); err != nil || env.Status != envelope.StatusCompleted {
		t.Fatalf("bob's call x2: %v %+v", err, env)
	}
	var gets atomic.Int64
	for _, subj := range []string{"$JS.API.DIRECT.GET." + n.AuditStream() + ".>", "$JS.API.DIRECT.GET." + n.AuditStream()} {
		sub, err := r.admin.NC.Subscribe(subj, func(*nats.Msg) { gets.Add(1) })
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sub.Unsubscribe() })
	}
	if err := r.admin.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	if _, err := bob.Execution(ctx, executor.ExecutionRequest{ExecutionID: "x1"}); !errors.Is(err, executor.ErrNoSuchExecution) {
		t.Fatalf("bob's reading of x1, which names nothing: %v, want ErrNoSuchExecution", err)
	}
	if g := gets.Swap(0); g > 0 {
		t.Errorf("reading an id that names nothing cost %d gets of the audit stream", g)
	}
	v, err := bob.Execution(ctx, executor.ExecutionRequest{ExecutionID: "x2"})
	if err != nil || v.Envelope == nil || len(v.Trail) == 0 || v.Trail[0].Type != "capability.requested" {
		t.Fatalf("bob's reading of x2: %v %+v, want its envelope and whole trail", err, v)
	}
	if g := gets.Load(); g > 20 {
		t.Errorf("reading x2 cost %d gets of the audit stream, with %d messages of others' executions on its shards before it began", g, filler)
	}
}
