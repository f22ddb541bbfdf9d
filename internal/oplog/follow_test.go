package oplog

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/internal/testenv"
)

// A follower whose bucket does not exist yet costs no message until the
// bucket is created, and binds when the server announces it: with the
// fallback's look pushed out of reach, the announcement alone brings the
// first write.
func TestFollow_BindsWhenTheBucketIsCreated(t *testing.T) {
	lookAgain = time.Hour
	t.Cleanup(func() { lookAgain = 30 * time.Second })
	env := testenv.Start(t)
	nc := env.Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	applied := make(chan string, 4)
	f, err := Follow(ctx, js, "T_FOLLOWED", "", nil, func(e jetstream.KeyValueEntry) { applied <- e.Key() })
	if err != nil {
		t.Fatal(err)
	}
	defer f.Stop()
	if f.Revision() != 0 {
		t.Fatalf("revision %d before the bucket exists", f.Revision())
	}
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "T_FOLLOWED"})
	if err != nil {
		t.Fatal(err)
	}
	rev, err := kv.Put(ctx, "k", []byte("v"))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case k := <-applied:
		if k != "k" {
			t.Fatalf("applied %q", k)
		}
	case <-ctx.Done():
		t.Fatal("the follower never bound the bucket created after it started")
	}
	if err := f.WaitRevision(ctx, rev); err != nil {
		t.Fatal(err)
	}
}

// A bucket purged whole (nats stream purge: its messages removed, no
// delete marker written) holds nothing, and a follower's copy comes to hold
// nothing too, as a follower starting then would, at its next look (here
// pushed close); what is put in the bucket afterwards is applied.
func TestFollow_ABucketPurgedWholeLeavesNothingInTheCopy(t *testing.T) {
	lookAgain = 50 * time.Millisecond
	t.Cleanup(func() { lookAgain = 30 * time.Second })
	env := testenv.Start(t)
	js, err := jetstream.New(env.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "T_PURGED"})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	held := map[string]bool{}
	f, err := Follow(ctx, js, "T_PURGED", "", nil, func(e jetstream.KeyValueEntry) {
		mu.Lock()
		defer mu.Unlock()
		held[e.Key()] = e.Operation() == jetstream.KeyValuePut
	})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Stop()
	holds := func(k string) bool {
		mu.Lock()
		defer mu.Unlock()
		return held[k]
	}
	for _, k := range []string{"a", "b"} {
		rev, err := kv.Put(ctx, k, []byte(k))
		if err != nil {
			t.Fatal(err)
		}
		if err := f.WaitRevision(ctx, rev); err != nil || !holds(k) {
			t.Fatalf("%s not applied: %v", k, err)
		}
	}
	s, err := js.Stream(ctx, "KV_T_PURGED")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Purge(ctx); err != nil {
		t.Fatal(err)
	}
	for holds("a") || holds("b") {
		select {
		case <-f.Changed():
		case <-ctx.Done():
			t.Fatal("the bucket was purged, and the copy still holds its keys")
		}
	}
	rev, err := kv.Put(ctx, "c", []byte("c"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.WaitRevision(ctx, rev); err != nil || !holds("c") || holds("a") {
		t.Fatalf("after the purge: c %v, a %v (%v)", holds("c"), holds("a"), err)
	}
}
