package broker_test

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// Open binds the envelopes and executions buckets for reading by key, without
// their stream information: a read answers as a bound bucket's does, and
// nothing else is possible through it.
func TestOpen_ReadsEnvelopesAndRecordsByKeyAsABoundBucketDoes(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	const retention = 2 * time.Hour
	full := provision(t, env.Connect(t), broker.Config{EnvelopeRetention: retention})
	ctx := testCtx(t)
	b, err := broker.Open(ctx, env.Connect(t), broker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := b.EnvelopeRetention(ctx); err != nil || got != retention {
		t.Fatalf("envelope retention %v, %v; want %v", got, err, retention)
	}
	if _, err := full.Executions.Put(ctx, "alice.x1", []byte("one")); err != nil {
		t.Fatal(err)
	}
	if _, err := full.Executions.Put(ctx, "alice.x1", []byte("two")); err != nil {
		t.Fatal(err)
	}
	want, err := full.Executions.Get(ctx, "alice.x1")
	if err != nil {
		t.Fatal(err)
	}
	got, err := b.Executions.Get(ctx, "alice.x1")
	if err != nil || string(got.Value()) != "two" || got.Revision() != want.Revision() || !got.Created().Equal(want.Created()) ||
		got.Key() != "alice.x1" || got.Bucket() != b.Names.ExecutionsBucket() || got.Operation() != jetstream.KeyValuePut {
		t.Fatalf("read by key %+v, %v; want %+v", got, err, want)
	}
	if _, err := b.Executions.Get(ctx, "alice.none"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("missing key: %v", err)
	}
	if err := full.Executions.Delete(ctx, "alice.x1"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := broker.Load[struct{}](ctx, b.Executions, "alice.x1"); !errors.Is(err, broker.ErrNotFound) {
		t.Fatalf("deleted key: %v", err)
	}
	if _, err := b.Envelopes.Put(ctx, "alice.x1", []byte("forged")); !errors.Is(err, broker.ErrByKeyOnly) {
		t.Fatalf("put through a bucket bound by key: %v", err)
	}
	if _, err := b.Envelopes.Status(ctx); !errors.Is(err, broker.ErrByKeyOnly) {
		t.Fatalf("status of a bucket bound by key: %v", err)
	}
}
