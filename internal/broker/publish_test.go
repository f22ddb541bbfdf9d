package broker_test

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// Broker.Create is the create-only write of every execution's claim and
// envelope: a key written once refuses a second create, on one server and on
// a replicated bucket, a key whose value was deleted takes a new one, and a
// TTL rides the message.
func TestBrokerCreate_CreateOnlyOverValuesAndDeleteMarkers(t *testing.T) {
	t.Parallel()
	t.Run("Create", func(t *testing.T) {
		t.Parallel()
		testCreateOnly(t, func(b *broker.Broker) createFunc {
			return func(kv jetstream.KeyValue, key string, v any, ttl time.Duration) (uint64, error) {
				return b.Create(testCtx(t), kv, key, v, ttl)
			}
		})
	})
	// CreateWithin is the same write, bounded by a timeout alone.
	t.Run("CreateWithin", func(t *testing.T) {
		t.Parallel()
		testCreateOnly(t, func(b *broker.Broker) createFunc {
			return func(kv jetstream.KeyValue, key string, v any, ttl time.Duration) (uint64, error) {
				return b.CreateWithin(5*time.Second, kv, key, v, ttl)
			}
		})
	})
}

// createFunc is Broker.Create or Broker.CreateWithin.
type createFunc func(kv jetstream.KeyValue, key string, v any, ttl time.Duration) (uint64, error)

func testCreateOnly(t *testing.T, with func(*broker.Broker) createFunc) {
	onEveryStore(t, func(t *testing.T, b *broker.Broker) {
		ctx := testCtx(t)
		kv := b.Executions
		create := with(b)
		rev, err := create(kv, "k", &counter{V: 1, N: 1}, time.Hour)
		if err != nil || rev == 0 {
			t.Fatalf("first create: rev %d, %v", rev, err)
		}
		if _, err := create(kv, "k", &counter{V: 1, N: 2}, time.Hour); !errors.Is(err, broker.ErrExists) {
			t.Fatalf("second create: %v, want ErrExists", err)
		}
		if v, got, err := broker.Load[counter](ctx, kv, "k"); err != nil || v.N != 1 || got != rev {
			t.Fatalf("after a refused create: %+v rev %d (%v), want n=1 rev %d", v, got, err, rev)
		}
		raw, err := b.JS.Stream(ctx, "KV_"+kv.Bucket())
		if err != nil {
			t.Fatal(err)
		}
		sm, err := raw.GetMsg(ctx, rev)
		if err != nil {
			t.Fatal(err)
		}
		if ttl := sm.Header.Get(jetstream.MsgTTLHeader); ttl != time.Hour.String() {
			t.Fatalf("TTL header %q, want %q", ttl, time.Hour.String())
		}
		if err := kv.Delete(ctx, "k"); err != nil {
			t.Fatal(err)
		}
		if _, err := create(kv, "k", &counter{V: 1, N: 3}, 0); err != nil {
			t.Fatalf("create over a delete marker: %v", err)
		}
		if v, _, err := broker.Load[counter](ctx, kv, "k"); err != nil || v.N != 3 {
			t.Fatalf("after the create over a delete marker: %+v (%v), want n=3", v, err)
		}
	})
}

// CreateWithin's timeout bounds the wait for an acknowledgement that never
// comes (a stream's leader lost with the reply): it ends unanswered, not
// waiting on.
func TestBrokerCreateWithin_UnansweredEndsAtItsTimeout(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	b := provision(t, env.Connect(t), broker.Config{})
	listener := env.Connect(t)
	sub, err := listener.SubscribeSync("$KV.silent.>")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := listener.Flush(); err != nil {
		t.Fatal(err)
	}
	_, err = b.CreateWithin(200*time.Millisecond, silentKV{b.Executions}, "k", &counter{V: 1}, 0)
	if !errors.Is(err, nats.ErrTimeout) {
		t.Fatalf("create nobody answers: %v, want nats.ErrTimeout", err)
	}
	if m, err := sub.NextMsg(5 * time.Second); err != nil || m.Header.Get(jetstream.ExpectedLastSubjSeqHeader) != "0" {
		t.Fatalf("the create's message: %v, %v", m, err)
	}
}

// silentKV is a bucket whose subjects no stream stores.
type silentKV struct{ jetstream.KeyValue }

func (silentKV) Bucket() string { return "silent" }

// PublishAck answers like jetstream's PublishMsg: the stream sequence, a
// duplicate message id, a refusal as a *jetstream.APIError, and no stream as
// ErrNoStreamResponse.
func TestPublishAck_SequenceRefusalAndNoStream(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	b := provision(t, env.Connect(t), broker.Config{})
	ctx := testCtx(t)
	data, _ := envelope.Marshal(&counter{V: 1})
	subj := "$KV." + b.Pools.Bucket() + ".publish-ack"
	first, err := broker.PublishAck(ctx, b.NC, &nats.Msg{Subject: subj, Data: data})
	if err != nil || first.Seq == 0 || first.Duplicate {
		t.Fatalf("publish: %+v, %v", first, err)
	}
	again, err := broker.PublishAck(ctx, b.NC, &nats.Msg{Subject: subj, Data: data})
	if err != nil || again.Seq != first.Seq+1 || again.Duplicate {
		t.Fatalf("second publish: %+v, %v; want sequence %d", again, err, first.Seq+1)
	}
	// A message id the stream has seen is a duplicate: nothing stored, the
	// first one's sequence answered.
	withID := func() *nats.Msg {
		return &nats.Msg{Subject: subj, Data: data, Header: nats.Header{jetstream.MsgIDHeader: []string{"once"}}}
	}
	stored, err := broker.PublishAck(ctx, b.NC, withID())
	if err != nil || stored.Duplicate {
		t.Fatalf("publish with an id: %+v, %v", stored, err)
	}
	if dup, err := broker.PublishAck(ctx, b.NC, withID()); err != nil || !dup.Duplicate || dup.Seq != stored.Seq {
		t.Fatalf("the same id again: %+v, %v; want a duplicate of sequence %d", dup, err, stored.Seq)
	}
	stale := &nats.Msg{Subject: subj, Data: data, Header: nats.Header{jetstream.ExpectedLastSubjSeqHeader: []string{"1"}}}
	var api *jetstream.APIError
	if _, err := broker.PublishAck(ctx, b.NC, stale); !errors.As(err, &api) || api.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequence {
		t.Fatalf("stale expectation: %v, want the wrong-last-sequence APIError", err)
	}
	if _, err := broker.PublishAck(ctx, b.NC, &nats.Msg{Subject: "no.stream.here", Data: data}); !errors.Is(err, jetstream.ErrNoStreamResponse) {
		t.Fatalf("no stream: %v, want ErrNoStreamResponse", err)
	}
}

// An asynchronous publish whose acknowledgement never comes (here a listener
// that never answers; in a cluster, a reply lost with a stream's leader)
// fails after AsyncAckTimeout and leaves the pending publishes: thousands of
// them would otherwise stall every later asynchronous publish.
func TestBrokerJetStream_UnansweredAsyncPublishIsReleased(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	b := provision(t, env.Connect(t), broker.Config{})
	listener := env.Connect(t)
	sub, err := listener.SubscribeSync("capstan-test.silent")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := listener.Flush(); err != nil {
		t.Fatal(err)
	}
	f, err := b.JS.PublishMsgAsync(&nats.Msg{Subject: "capstan-test.silent", Data: []byte("x")})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-f.Err():
		if !errors.Is(err, jetstream.ErrAsyncPublishTimeout) {
			t.Fatalf("unanswered publish ended with %v, want jetstream.ErrAsyncPublishTimeout", err)
		}
	case ack := <-f.Ok():
		t.Fatalf("unanswered publish acknowledged: %+v", ack)
	case <-testCtx(t).Done():
		t.Fatal("an unanswered asynchronous publish stayed pending")
	}
	if n := b.JS.PublishAsyncPending(); n != 0 {
		t.Fatalf("%d publishes still pending after the timeout", n)
	}
}
