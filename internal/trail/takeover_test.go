package trail

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/nats-io/nats.go"
)

// writer stores audit messages until stopped, retrying through a node's
// loss, and counts those stored.
type writer struct {
	stored atomic.Int64
	stop   func()
}

func startWriter(t *testing.T, b *broker.Broker, tag string) *writer {
	t.Helper()
	w := &writer{}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ctx.Err() == nil; i++ {
			key := fmt.Sprintf("_anon.%s-%06d", tag, i)
			m := &nats.Msg{Subject: b.Names.AuditSubject(key), Header: nats.Header{broker.AuditExecutionHeader: {key}},
				Data: []byte("event of " + key)}
			for ctx.Err() == nil {
				pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
				_, err := b.JS.PublishMsg(pctx, m)
				pcancel()
				if err == nil {
					w.stored.Add(1)
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	var once sync.Once
	w.stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	t.Cleanup(w.stop)
	return w
}

// lastSeq is the audit stream's last sequence.
func lastSeq(t *testing.T, b *broker.Broker) uint64 {
	t.Helper()
	for try := 0; ; try++ {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		info, err := b.Audit.Info(ctx)
		cancel()
		if err == nil {
			return info.State.LastSeq
		}
		if try == 20 {
			t.Fatal(err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// Two checkpointers share a deployment: one holds the lease; when its
// connection dies without releasing it, the other takes over after the
// lease, and the log they signed together verifies, with the checkpoint
// kept before the takeover.
func TestCheckpointer_TakeoverAfterItsHolderDied(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	b := provision(t, env.Connect(t))
	k := newKey(t, "test.example/takeover")
	w := startWriter(t, b, "w")

	// The first checkpointer, on a connection of its own that dies.
	anc := env.Connect(t)
	ab := provision(t, anc)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first := NewCheckpointer(ab, k.signer, k.vkey, k.known, Config{Interval: 100 * time.Millisecond, Lease: time.Second, Name: "first"})
	done := make(chan struct{})
	go func() { defer close(done); _ = first.Run(ctx) }()
	kept := waitCovered(t, b, publish(t, b, "x", 10))
	if !first.Holding() {
		t.Fatal("the only checkpointer does not hold the lease")
	}
	second := runCheckpointer(t, b, k, "second")
	time.Sleep(300 * time.Millisecond)
	if second.cp.Holding() {
		t.Fatal("two checkpointers hold the lease")
	}
	anc.Close() // dies: no release
	waitCovered(t, b, lastSeq(t, b)+1)
	if !second.cp.Holding() {
		t.Fatal("the second checkpointer did not take over")
	}
	cancel()
	<-done
	w.stop()
	waitCovered(t, b, lastSeq(t, b))
	r := verify(t, FromDeployment(b), k, VerifyOptions{Kept: kept})
	mustOK(t, r)
	if !r.KeptHolds || r.Messages != int64(lastSeq(t, b)) || r.Unchecked != 0 {
		t.Fatalf("report %+v", r)
	}
}

// A three-node cluster loses the node of the checkpointer that holds the
// duty while events are written: the checkpointer on another node takes
// over, the log verifies, and a checkpoint kept before the loss holds.
func TestCheckpointer_ClusterLosesANode(t *testing.T) {
	t.Parallel()
	c := testenv.StartCluster(t, 3)
	var ncs []*nats.Conn
	conn := func(i int) *broker.Broker {
		nc := c.Nodes[i].Connect(t)
		ncs = append(ncs, nc)
		return provision(t, nc)
	}
	b0, b1, b2 := conn(0), conn(1), conn(2)
	if b2.Replicas != 3 {
		t.Fatalf("replicas %d, want 3", b2.Replicas)
	}
	k := newKey(t, "test.example/cluster")
	cps := []*running{runCheckpointer(t, b0, k, "on-node-0"), runCheckpointer(t, b1, k, "on-node-1")}
	w := startWriter(t, b2, "w")
	kept := waitCovered(t, b2, publish(t, b2, "x", 50))
	// The node of the checkpointer that holds the lease goes, and the
	// checkpointer with it (as 'capstan server' runs it).
	holder := -1
	for holder < 0 {
		for i, r := range cps {
			if r.cp.Holding() {
				holder = i
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	ncs[holder].Close()
	c.StopNode(holder)
	time.Sleep(2 * time.Second)
	waitCovered(t, b2, lastSeq(t, b2)+20)
	deadline := time.Now().Add(time.Minute)
	for !cps[1-holder].cp.Holding() {
		if time.Now().After(deadline) {
			t.Fatal("the checkpointer on a live node did not take over")
		}
		time.Sleep(50 * time.Millisecond)
	}
	w.stop()
	waitCovered(t, b2, lastSeq(t, b2))
	r := verify(t, FromDeployment(b2), k, VerifyOptions{Kept: kept})
	mustOK(t, r)
	if !r.KeptHolds || r.Unchecked != 0 || r.Messages != int64(lastSeq(t, b2)) {
		t.Fatalf("report %+v", r)
	}
	t.Logf("%d events, %d checkpoints", r.Messages, r.Checkpoints)
}

// A checkpointer killed in the middle of an extension (the tiles of the
// new leaves stored, all or some, the checkpoint that covers them not
// signed) leaves a log the next one extends: it reads the tiles the last
// checkpoint authenticates, finds those stored ahead of it to be its own,
// and the log verifies with a checkpoint kept before the death.
func TestCheckpointer_KilledBetweenItsTilesAndItsCheckpoint(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		keep func(tiles []tileData) []tileData
	}{
		{"every tile stored", func(tiles []tileData) []tileData { return tiles }},
		{"the full tiles stored, not the last ones", func(tiles []tileData) []tileData {
			var out []tileData
			for _, td := range tiles {
				if td.tile.W == tileWidth {
					out = append(out, td)
				}
			}
			return out
		}},
		{"the level-0 tiles stored only", func(tiles []tileData) []tileData {
			var out []tileData
			for _, td := range tiles {
				if td.tile.L == 0 {
					out = append(out, td)
				}
			}
			return out
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			env := testenv.Start(t)
			b := provision(t, env.Connect(t))
			k := newKey(t, "test.example/killed")
			first := runCheckpointer(t, b, k, "first")
			kept := waitCovered(t, b, publish(t, b, "a", 200))
			first.stop()

			// The dying checkpointer's extension, as step makes it, over
			// two tile boundaries, up to the tiles it stored.
			last := publish(t, b, "b", 400)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			dying := NewCheckpointer(b, k.signer, k.vkey, k.known, Config{Name: "dying"})
			st, err := dying.load(ctx)
			if err != nil {
				t.Fatal(err)
			}
			dying.st = st
			for st.base+uint64(st.e.n) <= last {
				msgs, err := st.read.fetch(ctx, 1000)
				if err != nil {
					t.Fatal(err)
				}
				for _, m := range msgs {
					st.e.append(m.Leaf())
				}
			}
			if err := dying.writeTiles(ctx, tc.keep(st.e.take())); err != nil {
				t.Fatal(err)
			}
			dying.drop()
			// Killed here: no checkpoint, and the lease it never took.
			if signed, err := Latest(ctx, b, nil); err != nil || !bytes.Equal(signed, kept) {
				t.Fatalf("latest checkpoint changed: %v", err)
			}

			runCheckpointer(t, b, k, "next")
			last = publish(t, b, "c", 50)
			waitCovered(t, b, last)
			r := verify(t, FromDeployment(b), k, VerifyOptions{Kept: kept})
			mustOK(t, r)
			if !r.KeptHolds || r.Size != 650 || r.Messages != 650 || r.Unchecked != 0 {
				t.Fatalf("report %+v", r)
			}
		})
	}
}

// A checkpointer given a key the log was not signed with (another
// deployment's, or a rotation whose public key file did not follow)
// extends nothing and says why; nothing is signed, and the deployment does
// not state its key.
func TestCheckpointer_AnotherKeyExtendsNothing(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	b := provision(t, env.Connect(t))
	k := newKey(t, "test.example/log")
	first := runCheckpointer(t, b, k, "first")
	kept := waitCovered(t, b, publish(t, b, "a", 20))
	first.stop()
	publish(t, b, "b", 5)
	other := newKey(t, "test.example/log")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cp := NewCheckpointer(b, other.signer, other.vkey, other.known, Config{Interval: 50 * time.Millisecond})
	err := cp.step(ctx)
	if err == nil || !strings.Contains(err.Error(), "verifies with the log's keys") {
		t.Fatalf("step with another key: %v", err)
	}
	cp.drop()
	if signed, err := Latest(ctx, b, nil); err != nil || !bytes.Equal(signed, kept) {
		t.Fatalf("a checkpoint was signed with another key (%v)", err)
	}
	if stated, err := StatedKeys(ctx, b); err != nil || strings.Contains(stated, other.vkey) || !strings.Contains(stated, k.vkey) {
		t.Fatalf("stated keys %q (%v): want the log's alone", stated, err)
	}
}

// A checkpointer stopped while it takes the lease leaves the lease free:
// the write in flight lands before the release reads it, so another
// checkpointer takes the duty at once, not a lease later.
func TestCheckpointer_StoppedWhileTakingTheLease_LeavesItFree(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	b := provision(t, env.Connect(t))
	k := newKey(t, "capstan.test/stopped")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for round := range 300 {
		cp := NewCheckpointer(b, k.signer, k.vkey, k.known, Config{Interval: time.Hour, Name: "stopped"})
		runCtx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); _ = cp.Run(runCtx) }()
		time.Sleep(time.Duration(rand.IntN(1500)) * time.Microsecond)
		stop()
		<-done
		cur, _, err := broker.Load[lease](ctx, b.Trail, leaseKey)
		if errors.Is(err, broker.ErrNotFound) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if left := time.Until(cur.Until); left > 0 {
			t.Fatalf("round %d: the stopped checkpointer still holds the lease for %v", round, left.Round(time.Second))
		}
	}
}
