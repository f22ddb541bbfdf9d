package pauses

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// An admin who deletes the pauses bucket (nats kv rm, to clear every
// pause at once) leaves nothing paused: a worker's copy drops the pauses it
// held, as a worker starting then finds none and capstan pauses lists none,
// so that no pause no command can lift holds on. A pause put in the bucket
// made again is applied: once the copy says it has the pause's revision, it
// stops what the pause names.
func TestWatch_ABucketDeletedLeavesNothingPausedAndItsSuccessorApplies(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	b, err := broker.Provision(ctx, env.Connect(t), broker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	n, nc := b.Names, b.NC
	js, err := jetstream.New(env.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	w, err := Watch(ctx, js, n, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	bob := envelope.Actor{Kind: "user", ID: "bob"}
	put := func(capabilityID string) {
		t.Helper()
		ch, err := Apply(ctx, nc, n, &Pause{Scope: Scope{Capability: capabilityID}, Mode: Hold, Reason: "r", By: "admin"})
		if err != nil {
			t.Fatal(err)
		}
		if err := w.WaitRevision(ctx, ch.Revision); err != nil {
			t.Fatal(err)
		}
		if w.Load().Match("acme", capabilityID, bob) == nil {
			t.Fatalf("the copy says it applied revision %d, and does not pause %s", ch.Revision, capabilityID)
		}
	}
	for _, c := range []string{"a.one", "a.two", "a.three"} {
		put(c)
	}
	if err := b.JS.DeleteKeyValue(ctx, n.PausesBucket()); err != nil {
		t.Fatal(err)
	}
	for w.Load().Len() > 0 {
		select {
		case <-w.Changed():
		case <-ctx.Done():
			t.Fatalf("the bucket is gone, and the copy still holds %d pauses", w.Load().Len())
		}
	}
	put("b.new")
	if w.Load().Len() != 1 || w.Load().Match("acme", "a.one", bob) != nil {
		t.Fatalf("the copy holds %d pauses, a.one's among them: %v", w.Load().Len(), w.Load().Match("acme", "a.one", bob) != nil)
	}
}

// A record of the pauses bucket that is no pause a worker honours (it does
// not decode, does not validate, or sits under another scope's key: written
// by hand, or in another shape) is listed as what it is: the operator's
// listing names it, apart from the pauses in force, rather than fail whole
// or show as a pause what every worker ignores.
func TestList_SaysWhatTheWorkersIgnore(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	b, err := broker.Provision(ctx, env.Connect(t), broker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	n, nc := b.Names, b.NC
	ch, err := Apply(ctx, nc, n, &Pause{Scope: Scope{Capability: "a.one"}, Mode: Hold, Reason: "r", By: "admin"})
	if err != nil {
		t.Fatal(err)
	}
	kv, err := Bucket(ctx, b.JS, n, false)
	if err != nil {
		t.Fatal(err)
	}
	stop := Scope{Capability: "a.stop"}
	bad := map[string]string{
		stop.Key():                           `{"v":1,"scope":{"capability":"a.stop"},"mode":"stop","reason":"r","by":"admin"}`,
		Scope{Capability: "a.garbled"}.Key(): `{"v":1,"scope":`,
		"all":                                `{"v":1,"scope":{"capability":"a.elsewhere"},"mode":"hold","reason":"r","by":"admin"}`,
	}
	var rev uint64
	for k, v := range bad {
		if rev, err = kv.Put(ctx, k, []byte(v)); err != nil {
			t.Fatal(err)
		}
	}
	js, err := jetstream.New(env.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	w, err := Watch(ctx, js, n, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if err := w.WaitRevision(ctx, max(rev, ch.Revision)); err != nil {
		t.Fatal(err)
	}
	if w.Load().Len() != 1 {
		t.Fatalf("the worker honours %d pauses, want a.one's alone", w.Load().Len())
	}
	list, err := List(ctx, nc, kv)
	if len(list) != 1 || list[0].Scope.Capability != "a.one" {
		t.Fatalf("listed %d pauses, want a.one's alone: %v", len(list), err)
	}
	for k := range bad {
		if err == nil || !strings.Contains(err.Error(), k) {
			t.Errorf("the listing's error does not name %s: %v", k, err)
		}
	}
}
