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
	env := testenv.Start(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	b, err := broker.Provision(ctx, env.Connect(t), broker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	apply := func(reason string) (*Change, error) {
		return Apply(ctx, b.NC, b.Names, Applying{File: "p.cedar", Text: []byte(tenRules), Catalog: catalog, By: "admin", Reason: reason})
	}
	if _, err := apply("first"); err != nil {
		t.Fatal(err)
	}
	// What the stopped apply wrote: v.2, and nothing else.
	kv, err := Bucket(ctx, b.JS, b.Names, false)
	if err != nil {
		t.Fatal(err)
	}
	orphan, err := json.Marshal(&Version{V: 1, Version: 2, Text: tenRules, By: "admin", Reason: "stopped", AuditID: "x"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Create(ctx, versionKey(2), orphan); err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(env.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	w, err := Watch(ctx, js, b.Names, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
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
	env := testenv.Start(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	b, err := broker.Provision(ctx, env.Connect(t), broker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ch, err := Apply(ctx, b.NC, b.Names, Applying{File: "p.cedar", Text: []byte(tenRules), Catalog: catalog, By: "admin", Reason: "first"})
	if err != nil {
		t.Fatal(err)
	}
	kv, err := Bucket(ctx, b.JS, b.Names, false)
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(env.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	w, err := Watch(ctx, js, b.Names, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
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
	env := testenv.Start(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	b, err := broker.Provision(ctx, env.Connect(t), broker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	kv, err := Bucket(ctx, b.JS, b.Names, true)
	if err != nil {
		t.Fatal(err)
	}
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
	js, err := jetstream.New(env.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	w, err := Watch(ctx, js, b.Names, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
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
