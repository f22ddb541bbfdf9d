package broker_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
)

func replicasCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// streamReplicas returns the replica count of every stream of the design.
func streamReplicas(t *testing.T, ctx context.Context, js jetstream.JetStream, n broker.Names) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, name := range n.Streams() {
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatalf("stream %s: %v", name, err)
		}
		out[name] = s.CachedInfo().Config.Replicas
	}
	return out
}

func wantAll(t *testing.T, got map[string]int, want int) {
	t.Helper()
	if len(got) != 11 {
		t.Fatalf("%d streams, want 11: %v", len(got), got)
	}
	for name, r := range got {
		if r != want {
			t.Errorf("stream %s has %d replicas, want %d (all: %v)", name, r, want, got)
		}
	}
}

func TestAutoReplicas_SingleServerGetsOne(t *testing.T) {
	t.Parallel()
	ctx := replicasCtx(t)
	env := testenv.Start(t)
	nc := env.Connect(t)
	if got := broker.DetectReplicas(ctx, nc); got != 1 {
		t.Fatalf("DetectReplicas on a single server = %d, want 1", got)
	}
	b, err := broker.Provision(ctx, nc, broker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if b.Replicas != 1 {
		t.Fatalf("Broker.Replicas = %d, want 1", b.Replicas)
	}
	wantAll(t, streamReplicas(t, ctx, b.JS, b.Names), 1)
}

func TestAutoReplicas_KnownClusterSizeIsUsedForNewResources(t *testing.T) {
	t.Parallel()
	ctx := replicasCtx(t)
	env := testenv.Start(t)
	nc := env.Connect(t)
	// A server told it is one of three creates R3 resources, which a single
	// server refuses: the hint was used, not detection.
	if _, err := broker.Provision(ctx, nc, broker.Config{ClusterSize: 3}); err == nil {
		t.Fatal("R3 provisioning on a single server succeeded")
	}
	// Resources that exist keep their count whatever the hint says.
	if _, err := broker.Provision(ctx, nc, broker.Config{}); err != nil {
		t.Fatal(err)
	}
	if _, err := broker.Provision(ctx, nc, broker.Config{ClusterSize: 3}); err != nil {
		t.Fatalf("hint over existing R1 resources: %v", err)
	}
}

func TestSetReplicas_RefusesCountsJetStreamCannotHold(t *testing.T) {
	t.Parallel()
	ctx := replicasCtx(t)
	env := testenv.Start(t)
	nc := env.Connect(t)
	for _, n := range []int{0, -1, broker.MaxReplicas + 1} {
		if _, err := broker.SetReplicas(ctx, nc, broker.Config{}, n); err == nil {
			t.Errorf("SetReplicas(%d) succeeded", n)
		}
	}
	if _, err := broker.Provision(ctx, nc, broker.Config{Replicas: broker.MaxReplicas + 1}); err == nil {
		t.Errorf("Provision with %d replicas succeeded", broker.MaxReplicas+1)
	}
	// A single server holds R1 only: the server's refusal is reported, and
	// nothing changed.
	if _, err := broker.SetReplicas(ctx, nc, broker.Config{}, 3); err == nil {
		t.Fatal("SetReplicas(3) on a single server succeeded")
	}
	b, err := broker.Provision(ctx, nc, broker.Config{Replicas: 1})
	if err != nil {
		t.Fatalf("explicit R1 after a refused change: %v", err)
	}
	wantAll(t, streamReplicas(t, ctx, b.JS, b.Names), 1)
}

func TestAutoReplicas_ClusterOfTwoGetsOne(t *testing.T) {
	t.Parallel()
	ctx := replicasCtx(t)
	c := testenv.StartCluster(t, 2)
	if got := broker.DetectReplicas(ctx, c.Connect(t)); got != 1 {
		t.Fatalf("DetectReplicas on a 2-node cluster = %d, want 1", got)
	}
}

// TestReplicasOnAClusterOfThree shares one cluster between rules; each rule
// provisions under its own prefix, so that the rules run side by side.
func TestReplicasOnAClusterOfThree(t *testing.T) {
	t.Parallel()
	c := testenv.StartCluster(t, 3)

	t.Run("AutoDetectsThreeFromOneURL", func(t *testing.T) {
		t.Parallel()
		ctx := replicasCtx(t)
		nc := c.Nodes[0].Connect(t)
		if got := broker.DetectReplicas(ctx, nc); got != 3 {
			t.Fatalf("DetectReplicas = %d, want 3 (servers known %v)", got, nc.Servers())
		}
	})

	t.Run("AutoDetectsThreeByPingWhenNoServerIsAdvertised", func(t *testing.T) {
		t.Parallel()
		ctx := replicasCtx(t)
		nc := c.Nodes[1].Connect(t, nats.IgnoreDiscoveredServers())
		if n := len(nc.Servers()); n != 1 {
			t.Fatalf("connection knows %d servers, want only the one given", n)
		}
		if got := broker.DetectReplicas(ctx, nc); got != 3 {
			t.Fatalf("DetectReplicas = %d, want 3", got)
		}
	})

	t.Run("AutoProvisionsEveryStreamAndBucketR3", func(t *testing.T) {
		t.Parallel()
		ctx := replicasCtx(t)
		b, err := broker.Provision(ctx, c.Connect(t), broker.Config{Prefix: "AUTO3"})
		if err != nil {
			t.Fatal(err)
		}
		if b.Replicas != 3 {
			t.Fatalf("Broker.Replicas = %d, want 3", b.Replicas)
		}
		wantAll(t, streamReplicas(t, ctx, b.JS, b.Names), 3)
	})

	t.Run("LoadFromLeaderReadsWhatTheBucketHolds", func(t *testing.T) {
		t.Parallel()
		ctx := replicasCtx(t)
		nc := c.Connect(t)
		b, err := broker.Provision(ctx, nc, broker.Config{Prefix: "LEADER"})
		if err != nil {
			t.Fatal(err)
		}
		type rec struct {
			N int `json:"n"`
		}
		rev, err := broker.Create(ctx, b.Envelopes, "k", &rec{N: 7})
		if err != nil {
			t.Fatal(err)
		}
		got, gotRev, err := broker.LoadFromLeader[rec](ctx, nc, b.Envelopes, "k")
		if err != nil || got.N != 7 || gotRev != rev {
			t.Fatalf("LoadFromLeader = %+v rev %d, err %v; want 7 at rev %d", got, gotRev, err, rev)
		}
		if _, _, err := broker.LoadFromLeader[rec](ctx, nc, b.Envelopes, "missing"); !errors.Is(err, broker.ErrNotFound) {
			t.Fatalf("missing key: %v, want ErrNotFound", err)
		}
		if err := b.Envelopes.Delete(ctx, "k"); err != nil {
			t.Fatal(err)
		}
		if _, _, err := broker.LoadFromLeader[rec](ctx, nc, b.Envelopes, "k"); !errors.Is(err, broker.ErrNotFound) {
			t.Fatalf("deleted key: %v, want ErrNotFound", err)
		}
	})

	t.Run("KnownClusterSizeStandsInForDetection", func(t *testing.T) {
		t.Parallel()
		ctx := replicasCtx(t)
		b, err := broker.Provision(ctx, c.Connect(t), broker.Config{Prefix: "HINT1", ClusterSize: 1})
		if err != nil {
			t.Fatal(err)
		}
		wantAll(t, streamReplicas(t, ctx, b.JS, b.Names), 1)
		// An explicit count wins over the hint.
		b, err = broker.Provision(ctx, c.Connect(t), broker.Config{Prefix: "HINT3", ClusterSize: 1, Replicas: 3})
		if err != nil {
			t.Fatal(err)
		}
		wantAll(t, streamReplicas(t, ctx, b.JS, b.Names), 3)
	})

	t.Run("ExistingR1DeploymentKeepsWorkingUnderAuto", func(t *testing.T) {
		t.Parallel()
		ctx := replicasCtx(t)
		nc := c.Connect(t)
		cfg := broker.Config{Prefix: "OLD1"}
		explicit := cfg
		explicit.Replicas = 1
		if _, err := broker.Provision(ctx, nc, explicit); err != nil {
			t.Fatal(err)
		}
		b, err := broker.Provision(ctx, nc, cfg)
		if err != nil {
			t.Fatalf("auto over an existing R1 deployment: %v", err)
		}
		if b.Replicas != 1 {
			t.Fatalf("Broker.Replicas = %d, want the existing 1", b.Replicas)
		}
		wantAll(t, streamReplicas(t, ctx, b.JS, b.Names), 1)

		// A bucket that is missing is created like the rest of the deployment.
		if err := b.JS.DeleteKeyValue(ctx, b.Names.CatalogBucket()); err != nil {
			t.Fatal(err)
		}
		if _, err := broker.Provision(ctx, nc, cfg); err != nil {
			t.Fatal(err)
		}
		wantAll(t, streamReplicas(t, ctx, b.JS, b.Names), 1)
	})

	t.Run("ExplicitCountConflictsAndNamesTheCommand", func(t *testing.T) {
		t.Parallel()
		ctx := replicasCtx(t)
		nc := c.Connect(t)
		if _, err := broker.Provision(ctx, nc, broker.Config{Prefix: "PIN", Replicas: 1}); err != nil {
			t.Fatal(err)
		}
		_, err := broker.Provision(ctx, nc, broker.Config{Prefix: "PIN", Replicas: 3})
		if !errors.Is(err, broker.ErrConfigConflict) {
			t.Fatalf("explicit R3 over R1: %v, want ErrConfigConflict", err)
		}
		if !strings.Contains(err.Error(), "Replicas is 1") || !strings.Contains(err.Error(), "capstan admin replicas 3") {
			t.Fatalf("conflict does not say what differs and what to run: %v", err)
		}
		js, _ := jetstream.New(nc)
		wantAll(t, streamReplicas(t, ctx, js, broker.NewNames("PIN")), 1)
	})

	t.Run("SetReplicasScalesEveryStreamBucketAndConsumer", func(t *testing.T) {
		t.Parallel()
		ctx := replicasCtx(t)
		nc := c.Connect(t)
		cfg := broker.Config{Prefix: "SCALE", Replicas: 1}
		b, err := broker.Provision(ctx, nc, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.EnsurePool(ctx, broker.PoolConfig{Pool: "default", Capabilities: []string{"demo.echo"}}); err != nil {
			t.Fatal(err)
		}
		if _, err := b.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "SCALE_EXTRA", Subjects: []string{"scale.extra"}}); err != nil {
			t.Fatal(err)
		}
		// Data written before the change is kept.
		if _, err := b.Envelopes.Put(ctx, "before", []byte("kept")); err != nil {
			t.Fatal(err)
		}

		changes, err := broker.SetReplicas(ctx, nc, broker.Config{Prefix: "SCALE"}, 3, "SCALE_EXTRA", "SCALE_MISSING")
		if err != nil {
			t.Fatal(err)
		}
		if len(changes) != 12 {
			t.Fatalf("%d changes, want 11 streams and the extra one: %+v", len(changes), changes)
		}
		for _, ch := range changes {
			if ch.From != 1 || ch.To != 3 {
				t.Errorf("change %+v, want 1 to 3", ch)
			}
		}
		wantAll(t, streamReplicas(t, ctx, b.JS, b.Names), 3)
		extra, err := b.JS.Stream(ctx, "SCALE_EXTRA")
		if err != nil || extra.CachedInfo().Config.Replicas != 3 {
			t.Fatalf("extra stream not scaled: %v", err)
		}
		waitConsumerPeers(t, ctx, b, "pool-default", 2)
		e, err := b.Envelopes.Get(ctx, "before")
		if err != nil || string(e.Value()) != "kept" {
			t.Fatalf("value written before the change: %v", err)
		}

		// Now auto and explicit 3 both agree, and explicit 1 conflicts.
		if _, err := broker.Provision(ctx, nc, broker.Config{Prefix: "SCALE"}); err != nil {
			t.Fatalf("auto after scaling: %v", err)
		}
		if _, err := broker.Provision(ctx, nc, broker.Config{Prefix: "SCALE", Replicas: 3}); err != nil {
			t.Fatalf("explicit 3 after scaling: %v", err)
		}
		if _, err := broker.Provision(ctx, nc, cfg); !errors.Is(err, broker.ErrConfigConflict) {
			t.Fatalf("explicit 1 after scaling: %v, want ErrConfigConflict", err)
		}

		// Scaling down works the same way; a second identical call changes nothing.
		if _, err := broker.SetReplicas(ctx, nc, broker.Config{Prefix: "SCALE"}, 1); err != nil {
			t.Fatal(err)
		}
		again, err := broker.SetReplicas(ctx, nc, broker.Config{Prefix: "SCALE"}, 1)
		if err != nil {
			t.Fatal(err)
		}
		for _, ch := range again {
			if ch.From != 1 || ch.To != 1 {
				t.Errorf("repeated change %+v, want 1 to 1", ch)
			}
		}
		wantAll(t, streamReplicas(t, ctx, b.JS, b.Names), 1)
	})
}

// waitConsumerPeers waits until the consumer's group has the given number of
// followers: consumers follow their stream's replica count.
func waitConsumerPeers(t *testing.T, ctx context.Context, b *broker.Broker, name string, followers int) {
	t.Helper()
	for {
		c, err := b.Exec.Consumer(ctx, name)
		var got int
		if err == nil {
			info, ierr := c.Info(ctx)
			if ierr == nil && info.Cluster != nil {
				got = len(info.Cluster.Replicas)
				if got == followers {
					return
				}
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("consumer %s has %d followers, want %d (err %v)", name, got, followers, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}
