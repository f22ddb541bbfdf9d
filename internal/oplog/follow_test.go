package oplog

import (
	"context"
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
