package auth_test

import (
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
)

// A producer's reading of an execution id that names nothing costs the
// workers and the server one message get per message of the id's audit
// shards since the stream began (its own and the legacy one): bob, asking
// for "x1", makes a worker walk every other execution's events there.
func TestTenant_ReadingAnIDThatNamesNothingCostsBoundedGets(t *testing.T) {
	r := newTenantRig(t, embedded, broker.Config{})
	ctx := testCtx(t)
	bob, _ := r.client(t, "bob")
	n := r.admin.Names
	const filler = 5000
	for _, key := range []string{"bob.x1", "x1"} {
		subj := n.AuditSubject(key)
		for i := range filler {
			m := nats.NewMsg(subj)
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
	var gets atomic.Int64
	sub, err := r.admin.NC.Subscribe("$JS.API.DIRECT.GET."+n.AuditStream()+".>", func(*nats.Msg) { gets.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	sub2, err := r.admin.NC.Subscribe("$JS.API.DIRECT.GET."+n.AuditStream(), func(*nats.Msg) { gets.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	if err := r.admin.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	_, err = bob.Execution(ctx, executor.ExecutionRequest{V: envelope.Version, ExecutionID: "x1"})
	_ = sub.Unsubscribe()
	_ = sub2.Unsubscribe()
	t.Logf("bob's reading of x1: %v; audit gets: %d", err, gets.Load())
	if g := gets.Load(); g > filler/10 {
		t.Errorf("one reading of an id that names nothing cost %d gets of the audit stream, with %d messages of others' executions on each of its shards", g, filler)
	}
}
