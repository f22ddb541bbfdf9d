package broker_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
)

type counted struct {
	N int `json:"n"`
}

// sent is how many messages nc sent while f ran: a read's round trips.
func sent(nc *nats.Conn, f func()) uint64 {
	before := nc.Stats().OutMsgs
	f()
	return nc.Stats().OutMsgs - before
}

// A replica behind the leader answers direct gets of keys it has not
// applied "not found" (here a copy left behind, answering about half of the
// reads of its node). LoadCurrent, GetCurrent and Present find every key
// written, asking the leader only when a direct get found nothing; Load
// alone calls some absent.
func TestLoadCurrent_AReplicaBehindNeverCallsAWrittenKeyAbsent(t *testing.T) {
	t.Parallel()
	ctx := replicasCtx(t)
	c := testenv.StartCluster(t, 3)
	cfg := broker.Config{Prefix: "BEHIND", Replicas: 3}
	writer, err := broker.Provision(ctx, c.Connect(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	bucket := writer.Names.ExecutionsBucket()
	if _, err := broker.Create(ctx, writer.Executions, "first", &counted{N: -1}); err != nil {
		t.Fatal(err)
	}
	node := c.StaleCopy(t, "KV_"+bucket, "$KV."+bucket+".first")
	nc := c.Nodes[node].Connect(t)
	reader, err := broker.OpenAll(ctx, nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if reader.Replicas != 3 || !reader.ReadsMayLag() {
		t.Fatalf("Replicas %d, ReadsMayLag %v; want 3, true", reader.Replicas, reader.ReadsMayLag())
	}
	// A principal's broker knows no replica count: a cluster may lag.
	if open, err := broker.Open(ctx, nc, cfg); err != nil || open.Replicas != 0 || !open.ReadsMayLag() {
		t.Fatalf("Open on a cluster: %v; want Replicas 0 and ReadsMayLag", err)
	}
	const n = 200
	absent := 0
	for i := range n {
		key := fmt.Sprintf("k%d", i)
		if _, err := broker.Create(ctx, writer.Executions, key, &counted{N: i}); err != nil {
			t.Fatal(err)
		}
		if _, _, err := broker.Load[counted](ctx, reader.Executions, key); errors.Is(err, broker.ErrNotFound) {
			absent++
		}
		var got *counted
		msgs := sent(nc, func() { got, _, err = broker.LoadCurrent[counted](ctx, reader, reader.Executions, key) })
		if err != nil || got.N != i {
			t.Fatalf("LoadCurrent(%s) = %+v, %v; want n %d", key, got, err, i)
		}
		if msgs > 2 {
			t.Fatalf("LoadCurrent(%s) sent %d requests, want 1, or 2 when a replica behind answered", key, msgs)
		}
		if ok, err := broker.Present(ctx, reader, reader.Executions, key); !ok || err != nil {
			t.Fatalf("Present(%s) = %v, %v; want true", key, ok, err)
		}
		if data, _, err := broker.GetCurrent(ctx, reader, reader.Executions, key); err != nil || len(data) == 0 {
			t.Fatalf("GetCurrent(%s) = %d bytes, %v; want the stored value", key, len(data), err)
		}
	}
	if absent == 0 {
		t.Fatal("Load found every key: no read was answered by the replica behind, and the test proves nothing")
	}
	t.Logf("a direct get called %d of %d written keys absent", absent, n)
	// A key never written is absent for the leader too.
	if msgs := sent(nc, func() { _, _, err = broker.LoadCurrent[counted](ctx, reader, reader.Executions, "never") }); !errors.Is(err, broker.ErrNotFound) || msgs != 2 {
		t.Fatalf("a key never written: %v after %d requests; want ErrNotFound after 2", err, msgs)
	}
	if ok, err := broker.Present(ctx, reader, reader.Executions, "never"); ok || err != nil {
		t.Fatalf("Present(never) = %v, %v; want false", ok, err)
	}
	// Deleted is absent. A follower that has applied the put but not yet
	// the delete still answers the old value: stale, never another one.
	if err := writer.Executions.Delete(ctx, "k0"); err != nil {
		t.Fatal(err)
	}
	for {
		got, _, err := broker.LoadCurrent[counted](ctx, reader, reader.Executions, "k0")
		if errors.Is(err, broker.ErrNotFound) {
			break
		}
		if err != nil || got.N != 0 {
			t.Fatalf("a deleted key: %+v, %v; want ErrNotFound, or its old value while a follower lags", got, err)
		}
		if ctx.Err() != nil {
			t.Fatal("a deleted key was never absent")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// On one replica an absence is the direct get's: one request, found or not.
func TestLoadCurrent_OneReplicaCostsOneRequest(t *testing.T) {
	t.Parallel()
	ctx := replicasCtx(t)
	env := testenv.Start(t)
	nc := env.Connect(t)
	b, err := broker.Provision(ctx, nc, broker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if b.ReadsMayLag() {
		t.Fatal("ReadsMayLag on a single server")
	}
	if _, err := broker.Create(ctx, b.Executions, "k", &counted{N: 1}); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"k", "never"} {
		if msgs := sent(nc, func() { _, _, _ = broker.LoadCurrent[counted](ctx, b, b.Executions, key) }); msgs != 1 {
			t.Errorf("LoadCurrent(%s) sent %d requests, want 1", key, msgs)
		}
	}
	// A broker of Open's knows no replica count: a single server says one.
	open, err := broker.Open(context.Background(), env.Connect(t), broker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if open.Replicas != 0 || open.ReadsMayLag() {
		t.Fatalf("Open on a single server: Replicas %d, ReadsMayLag %v; want 0, false", open.Replicas, open.ReadsMayLag())
	}
}

// A client's broker (Open's) on a cluster keeps confirming absences while
// its connection is reconnecting after its server was lost: at that moment
// the connection names no cluster, and a direct get's "not found", answered
// once it is back by whichever replica, would otherwise be taken as final.
func TestReadsMayLag_StaysWhileTheConnectionReconnects(t *testing.T) {
	t.Parallel()
	ctx := replicasCtx(t)
	c := testenv.StartCluster(t, 3)
	if _, err := broker.Provision(ctx, c.Connect(t), broker.Config{Prefix: "RECONNECT", Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	// On node 0 alone, and slow to come back: it stays reconnecting.
	nc := c.Nodes[0].Connect(t, nats.IgnoreDiscoveredServers(), nats.ReconnectWait(time.Minute))
	open, err := broker.Open(ctx, nc, broker.Config{Prefix: "RECONNECT"})
	if err != nil {
		t.Fatal(err)
	}
	if !open.ReadsMayLag() {
		t.Fatal("Open on a cluster: ReadsMayLag false")
	}
	c.StopNode(0)
	for nc.Status() == nats.CONNECTED {
		if ctx.Err() != nil {
			t.Fatal("the connection never noticed its server was lost")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !open.ReadsMayLag() {
		t.Fatalf("connection %v: ReadsMayLag false; a replica's absence would be taken as final", nc.Status())
	}
}
