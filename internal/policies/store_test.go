package policies

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// An apply stopped between its two writes (the command killed, its
// connection lost, its time out) leaves a version written that was never
// put in force. The next apply is not refused for it, again and again, as
// if another operator had applied meanwhile: it takes the next number, and
// a worker puts it in force.
func TestApply_AfterAnApplyStoppedBetweenItsWrites(t *testing.T) {
	t.Parallel()
	r := newStoreRig(t)
	ctx, b := r.ctx, r.b
	apply := func(reason string) (*Change, error) {
		return Apply(ctx, b.NC, b.Names, Applying{File: "p.cedar", Text: []byte(tenRules), Catalog: catalog, By: "admin", Reason: reason})
	}
	if _, err := apply("first"); err != nil {
		t.Fatal(err)
	}
	// What the stopped apply wrote: v.2, and nothing else.
	kv := r.bucket(false)
	orphan, err := json.Marshal(&Version{V: 1, Version: 2, Text: tenRules, By: "admin", Reason: "stopped", AuditID: "x"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Create(ctx, versionKey(2), orphan); err != nil {
		t.Fatal(err)
	}
	w := r.watch()
	for i, reason := range []string{"second", "third"} {
		ch, err := apply(reason)
		if err != nil {
			t.Fatalf("apply %s after a stopped one: %v", reason, err)
		}
		if want := 3 + i; ch.Version.Version != want || ch.Current.Version != want || ch.Current.Latest != want {
			t.Fatalf("apply %s: v%d in force (latest v%d), want v%d", reason, ch.Current.Version, ch.Current.Latest, want)
		}
		if err := w.WaitRevision(ctx, ch.Revision); err != nil {
			t.Fatal(err)
		}
		if s := w.Load(); s == nil || s.Err() != nil || s.Version != ch.Version.Version {
			t.Fatalf("apply %s: the worker's copy is not v%d", reason, ch.Version.Version)
		}
	}
}

// A current key that does not decode (written by hand, or by a release
// that wrote another shape) fails every call closed on every worker, and
// says so; the operator's commands are how it is put right: a removal and
// an apply each replace it, and the workers follow.
func TestApplyAndRemove_ReplaceACurrentKeyThatDoesNotDecode(t *testing.T) {
	t.Parallel()
	r := newStoreRig(t)
	ctx, b := r.ctx, r.b
	ch, err := Apply(ctx, b.NC, b.Names, Applying{File: "p.cedar", Text: []byte(tenRules), Catalog: catalog, By: "admin", Reason: "first"})
	if err != nil {
		t.Fatal(err)
	}
	kv := r.bucket(false)
	w := r.watch()
	rev := ch.Revision
	spoil := func() {
		t.Helper()
		r, err := kv.Update(ctx, currentKey, []byte(`{"version":"seven"`), rev)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.WaitRevision(ctx, r); err != nil {
			t.Fatal(err)
		}
		if s := w.Load(); s == nil || s.Err() == nil {
			t.Fatal("a current key that does not decode: the worker's copy is not broken")
		}
	}
	spoil()
	removed, err := Remove(ctx, b.NC, b.Names, "admin", "", "put it right")
	if err != nil {
		t.Fatalf("remove over a current key that does not decode: %v", err)
	}
	if err := w.WaitRevision(ctx, removed.Revision); err != nil {
		t.Fatal(err)
	}
	if s := w.Load(); s != nil {
		t.Fatalf("removed: the worker's copy holds v%d (%v)", s.Version, s.Err())
	}
	rev = removed.Revision
	spoil()
	applied, err := Apply(ctx, b.NC, b.Names, Applying{File: "p.cedar", Text: []byte(tenRules), Catalog: catalog, By: "admin", Reason: "again"})
	if err != nil {
		t.Fatalf("apply over a current key that does not decode: %v", err)
	}
	if applied.Version.Version != 2 {
		t.Fatalf("applied v%d, want v2 after v1", applied.Version.Version)
	}
	if err := w.WaitRevision(ctx, applied.Revision); err != nil {
		t.Fatal(err)
	}
	if s := w.Load(); s == nil || s.Err() != nil || s.Version != 2 {
		t.Fatal("applied: the worker's copy is not v2")
	}
}

// A version that could not be read when it was put in force (here: named
// in force, by hand, before it was written; as well a server that did not
// answer for longer than the worker waits) fails calls closed while it
// cannot be read, not until the next change: the worker reads it again,
// and puts it in force once it can.
func TestWatch_AVersionUnreadWhenPutInForceLoadsOnceItReads(t *testing.T) {
	t.Parallel()
	r := newStoreRig(t)
	ctx := r.ctx
	kv := r.bucket(true)
	set, err := Compile("p.cedar", []byte(tenRules))
	if err != nil {
		t.Fatal(err)
	}
	cur, err := json.Marshal(&Current{V: 1, Version: 1, Latest: 1, SHA256: set.SHA256, By: "admin", Reason: "r", AuditID: "x"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Create(ctx, currentKey, cur); err != nil {
		t.Fatal(err)
	}
	w := r.watch()
	if s := w.Load(); s == nil || s.Err() == nil {
		t.Fatal("v1 in force and not written: the worker's copy is not broken")
	}
	v1, err := json.Marshal(&Version{V: 1, Version: 1, Text: tenRules, SHA256: set.SHA256, By: "admin", Reason: "r", AuditID: "x"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Create(ctx, versionKey(1), v1); err != nil {
		t.Fatal(err)
	}
	for s := w.Load(); s == nil || s.Err() != nil || s.Version != 1; s = w.Load() {
		select {
		case <-ctx.Done():
			t.Fatal("v1 written: the worker's copy never loads it")
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// storeRig is a deployment on one server for the store's tests: the
// test's context and the broker provisioned, and what a test opens.
type storeRig struct {
	t   *testing.T
	ctx context.Context
	env *testenv.Env
	b   *broker.Broker
}

func newStoreRig(t *testing.T) *storeRig {
	t.Helper()
	env := testenv.Start(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	b, err := broker.Provision(ctx, env.Connect(t), broker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return &storeRig{t: t, ctx: ctx, env: env, b: b}
}

// bucket opens the policies bucket (with create, makes it).
func (r *storeRig) bucket(create bool) jetstream.KeyValue {
	r.t.Helper()
	kv, err := Bucket(r.ctx, r.b.JS, r.b.Names, create)
	if err != nil {
		r.t.Fatal(err)
	}
	return kv
}

// watch starts a worker's copy, on a connection of its own, stopped when
// the test ends.
func (r *storeRig) watch() *Watcher {
	r.t.Helper()
	js, err := jetstream.New(r.env.Connect(r.t))
	if err != nil {
		r.t.Fatal(err)
	}
	w, err := Watch(r.ctx, js, r.b.Names, nil)
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(w.Stop)
	return w
}

// A current key written by a newer version (another schema version, a
// field this one does not know) may mean what this version cannot honour:
// every call fails closed, not the set it names as this version reads it.
func TestWatch_ACurrentKeyOfANewerVersionFailsClosed(t *testing.T) {
	t.Parallel()
	r := newStoreRig(t)
	ch, err := Apply(r.ctx, r.b.NC, r.b.Names, Applying{File: "p.cedar", Text: []byte(tenRules), Catalog: catalog, By: "admin", Reason: "r"})
	if err != nil {
		t.Fatal(err)
	}
	newer := *ch.Current
	newer.V = 99
	b, err := json.Marshal(&newer)
	if err != nil {
		t.Fatal(err)
	}
	kv := r.bucket(false)
	if _, err := kv.Put(r.ctx, currentKey, b); err != nil {
		t.Fatal(err)
	}
	w := r.watch()
	if s := w.Load(); s == nil || s.Err() == nil {
		t.Fatalf("a current key of schema version 99: the worker's copy is %+v, not broken", s)
	}
}
