package broker_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// A full queue refuses the next request at its publication, naming the
// quota it is over; nothing stored is dropped to make room.
func TestQueue_FullRefusesAtPublicationAndDropsNothing(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	ctx := testCtx(t)
	b := provision(t, env.Connect(t), broker.Config{QueueMaxBytes: 4096})
	body := make([]byte, 1000)
	stored := 0
	var err error
	for ; stored < 100; stored++ {
		if _, err = b.JS.Publish(ctx, b.Names.ExecSubject(broker.Anonymous, "demo.echo"), body); err != nil {
			break
		}
	}
	full := broker.AsQueueFull(err)
	if full == nil || full.Quota != envelope.QuotaQueuedBytes {
		t.Fatalf("after %d requests: %v, want a full queue's refusal of its bytes", stored, err)
	}
	info, ierr := b.Exec.Info(ctx)
	if ierr != nil {
		t.Fatal(ierr)
	}
	if stored == 0 || info.State.Msgs != uint64(stored) || info.State.FirstSeq != 1 {
		t.Fatalf("stream holds %d requests from sequence %d, want the %d stored from 1", info.State.Msgs, info.State.FirstSeq, stored)
	}
	// The publication path every client takes says the same.
	m := nats.NewMsg(b.Names.ExecSubject(broker.Anonymous, "demo.echo"))
	m.Data = body
	if _, err := broker.PublishAck(ctx, b.NC, m); !errors.Is(err, broker.ErrQueueFull) {
		t.Fatalf("PublishAck to a full queue: %v, want ErrQueueFull", err)
	}
}

// An exec stream of an earlier version, unbounded and discarding the
// oldest, is kept as it is by a process that sets no bound (a worker), and
// bounded, refusing new requests once full, by one that does (a server);
// its requests stay.
func TestQueue_SharedStreamOfAnEarlierVersionBoundedWhenAsked(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	ctx := testCtx(t)
	nc := env.Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream(capstanExec(func(*jetstream.StreamConfig) {}))(ctx, js); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "capstan.exec._anon.demo.echo", []byte("queued before")); err != nil {
		t.Fatal(err)
	}
	kept := provision(t, nc, broker.Config{}).Exec.CachedInfo().Config
	if kept.Discard != jetstream.DiscardOld || kept.MaxBytes > 0 {
		t.Fatalf("a worker's provisioning changed the bound: %+v", kept)
	}
	b := provision(t, nc, broker.Config{QueueMaxBytes: 1 << 20})
	got := b.Exec.CachedInfo()
	if got.Config.Discard != jetstream.DiscardNew || got.Config.MaxBytes != 1<<20 || got.State.Msgs != 1 {
		t.Fatalf("bounded stream: %+v, %d requests", got.Config, got.State.Msgs)
	}
}

// ProvisionQueues gives each principal a queue of its own, bounded by its
// limits and the deployment's bytes; narrows the shared stream to the
// anonymous principal (the requests it holds stay, still served by its
// consumers); changes limits; and deletes the queue of a principal removed
// once it is empty, never before.
func TestProvisionQueues_OnePerPrincipalBoundedAndRetired(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	ctx := testCtx(t)
	nc := env.Connect(t)
	b := provision(t, nc, broker.Config{QueueMaxBytes: 1 << 20})
	pool, err := b.EnsurePool(ctx, broker.PoolConfig{Pool: "p", Capabilities: []string{"demo.echo"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.JS.Publish(ctx, b.Names.ExecSubject("alice", "demo.echo"), []byte("stored before alice had a queue")); err != nil {
		t.Fatal(err)
	}
	want := map[string]broker.QueueLimits{"alice": {Requests: 2, Bytes: -1}, "bob": {Requests: -1, Bytes: 4 << 20}}
	if err := broker.ProvisionQueues(ctx, b.JS, b.Names, want); err != nil {
		t.Fatal(err)
	}
	shared, err := b.JS.Stream(ctx, "CAPSTAN_EXEC")
	if err != nil {
		t.Fatal(err)
	}
	if s := shared.CachedInfo(); !slices.Equal(s.Config.Subjects, []string{"capstan.exec._anon.>"}) || s.State.Msgs != 1 {
		t.Fatalf("shared stream: subjects %v, %d requests", s.Config.Subjects, s.State.Msgs)
	}
	for _, tc := range []struct {
		principal         string
		maxMsgs, maxBytes int64
	}{{"alice", 2, 1 << 20}, {"bob", -1, 1 << 20}} {
		s, err := b.JS.Stream(ctx, "CAPSTAN_EXEC_"+tc.principal)
		if err != nil {
			t.Fatal(err)
		}
		c := s.CachedInfo().Config
		if !slices.Equal(c.Subjects, []string{"capstan.exec." + tc.principal + ".>"}) || c.Retention != jetstream.WorkQueuePolicy ||
			c.Discard != jetstream.DiscardNew || c.MaxMsgs != tc.maxMsgs || c.MaxBytes != tc.maxBytes ||
			c.MaxAge != broker.DefaultRecordTTL || c.Duplicates != broker.DefaultDedupWindow {
			t.Errorf("queue of %s: %+v", tc.principal, c)
		}
	}
	// The request stored before the split is still served.
	msgs, err := pool.Fetch(1)
	if err != nil {
		t.Fatal(err)
	}
	for m := range msgs.Messages() {
		if string(m.Data()) != "stored before alice had a queue" {
			t.Fatalf("pool got %q", m.Data())
		}
		_ = m.Ack()
	}
	// alice's queue holds two requests, and refuses the third.
	for i := range 3 {
		_, err := b.JS.Publish(ctx, b.Names.ExecSubject("alice", "demo.echo"), []byte("r"))
		if full := broker.AsQueueFull(err); (i < 2) != (err == nil) || (i == 2 && (full == nil || full.Quota != envelope.QuotaQueuedRequests)) {
			t.Fatalf("alice's request %d: %v", i, err)
		}
	}
	// A quota changed; bob removed while his queue is empty, alice while
	// hers holds requests.
	if err := broker.ProvisionQueues(ctx, b.JS, b.Names, map[string]broker.QueueLimits{"alice": {Requests: 5, Bytes: -1}}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.JS.Stream(ctx, "CAPSTAN_EXEC_bob"); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("bob's empty queue after his removal: %v", err)
	}
	if s, err := b.JS.Stream(ctx, "CAPSTAN_EXEC_alice"); err != nil || s.CachedInfo().Config.MaxMsgs != 5 {
		t.Fatalf("alice's queue after her quota changed: %v", err)
	}
	if err := broker.ProvisionQueues(ctx, b.JS, b.Names, map[string]broker.QueueLimits{"carol": {Requests: -1, Bytes: -1}}); err != nil {
		t.Fatal(err)
	}
	if s, err := b.JS.Stream(ctx, "CAPSTAN_EXEC_alice"); err != nil || s.CachedInfo().State.Msgs != 2 {
		t.Fatalf("alice's queue, holding requests, after her removal: %v", err)
	}
	queues, err := b.Queues(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, q := range queues {
		names = append(names, q.Name+"/"+q.Principal)
	}
	if !slices.Equal(names, []string{"CAPSTAN_EXEC/", "CAPSTAN_EXEC_alice/alice", "CAPSTAN_EXEC_carol/carol"}) {
		t.Fatalf("queues: %v", names)
	}
}
