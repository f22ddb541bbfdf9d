package policies

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// On a cluster, a replica behind the policies bucket's leader answers a
// direct get of a version it has not applied "not found" (here a copy left
// behind, holding v.1 alone, takes part in the bucket's direct gets on one
// node). A worker on that node, told by its watcher that v.N is in force,
// loads v.N all the same: a version is written before it is put in force,
// so its absence is a lag, never a set to fail every call closed for until
// the next apply. An operator's apply, from a node whose direct gets the
// copy answers too, reads what is in force as the leader holds it, and is
// not refused as if another operator had changed it.
func TestWatch_AReplicaBehindNeverBreaksTheSetInForce(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	c := testenv.StartCluster(t, 3)
	b, err := broker.Provision(ctx, c.Connect(t), broker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	n := b.Names
	text := func(v int) []byte { return fmt.Appendf(nil, "%s\n// version %d\n", tenRules, v) }
	apply := func(nodeNC int, v int) *Change {
		t.Helper()
		ch, err := Apply(ctx, c.Nodes[nodeNC].Connect(t), n, Applying{File: "p.cedar", Text: text(v), Catalog: catalog,
			By: "admin", Reason: fmt.Sprintf("version %d", v)})
		if err != nil || ch.Version.Version != v {
			t.Fatalf("apply v%d: %+v, %v", v, ch, err)
		}
		return ch
	}
	apply(0, 1)
	bucket := n.PoliciesBucket()
	behind := c.StaleCopy(t, "KV_"+bucket, "$KV."+bucket+".v.1")
	admin := (behind + 1) % len(c.Nodes)
	var js jetstream.JetStream
	js, err = jetstream.New(c.Nodes[behind].Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	w, err := Watch(ctx, js, n, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	kv, err := js.KeyValue(ctx, bucket)
	if err != nil {
		t.Fatal(err)
	}
	missed := 0
	for v := 2; v <= 9; v++ {
		ch := apply(admin, v)
		if err := w.WaitRevision(ctx, ch.Revision); err != nil {
			t.Fatal(err)
		}
		if s := w.Load(); s == nil || s.Err() != nil || s.Version != v {
			var why error
			if s != nil {
				why = s.Err()
			}
			t.Fatalf("v%d in force, the worker behind holds %v (broken: %v)", v, s != nil && s.Version == v, why)
		}
		// What a direct get of the node behind says, for the proof that
		// the copy behind answered some of them.
		for range 4 {
			if _, err := kv.Get(ctx, versionKey(v)); errors.Is(err, jetstream.ErrKeyNotFound) {
				missed++
			}
		}
		got, err := ReadVersion(ctx, js.Conn(), kv, v)
		if err != nil || got.Version != v {
			t.Fatalf("read v%d on the node behind: %+v, %v", v, got, err)
		}
	}
	if missed == 0 {
		t.Fatal("no direct get was answered by the copy behind: the test proves nothing")
	}
	t.Logf("a direct get called %d of %d versions absent", missed, 8*4)
}
