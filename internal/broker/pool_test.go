package broker_test

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// consumerInfo reads a consumer's info from the server, not from a cache.
func consumerInfo(t *testing.T, b *broker.Broker, name string) *jetstream.ConsumerInfo {
	t.Helper()
	ctx := testCtx(t)
	// Listing also reads push consumers, which Stream.Consumer refuses.
	list := b.Exec.ListConsumers(ctx)
	var found *jetstream.ConsumerInfo
	for info := range list.Info() { // drained to the end, or its goroutine stays
		if info.Name == name {
			found = info
		}
	}
	if err := list.Err(); err != nil {
		t.Fatalf("list consumers: %v", err)
	}
	if found == nil {
		t.Fatalf("no consumer %s", name)
	}
	return found
}

func filters(info *jetstream.ConsumerInfo) []string {
	f := slices.Clone(info.Config.FilterSubjects)
	if info.Config.FilterSubject != "" {
		f = append(f, info.Config.FilterSubject)
	}
	slices.Sort(f)
	return f
}

func TestEnsurePool_CreatesDurableFilteredOnItsCapabilities(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	env := testenv.Start(t)
	b := provision(t, env.Connect(t), broker.Config{})

	c, err := b.EnsurePool(ctx, broker.PoolConfig{
		Pool:          "billing",
		Capabilities:  []string{"orders.refund", "email.send"},
		MaxAckPending: 64,
		AckWait:       45 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	info := consumerInfo(t, b, "pool-billing")
	cfg := info.Config
	if c.CachedInfo().Name != "pool-billing" || cfg.Durable != "pool-billing" {
		t.Errorf("consumer %q durable %q, want pool-billing", c.CachedInfo().Name, cfg.Durable)
	}
	if want := []string{"capstan.exec.*.email.send", "capstan.exec.*.orders.refund"}; !reflect.DeepEqual(filters(info), want) {
		t.Errorf("filters %v, want %v", filters(info), want)
	}
	if cfg.MaxDeliver != -1 || cfg.AckPolicy != jetstream.AckExplicitPolicy || cfg.DeliverPolicy != jetstream.DeliverAllPolicy {
		t.Errorf("max deliver %d, ack %v, deliver %v; want -1, explicit, all", cfg.MaxDeliver, cfg.AckPolicy, cfg.DeliverPolicy)
	}
	if cfg.MaxAckPending != 64 || cfg.AckWait != 45*time.Second {
		t.Errorf("max ack pending %d, ack wait %v; want 64, 45s", cfg.MaxAckPending, cfg.AckWait)
	}

	// The consumer delivers its capabilities' requests, and only those.
	js := env.JetStream(t)
	for _, subj := range []string{"capstan.exec.p.other.thing", "capstan.exec.p.orders.refund"} {
		if _, err := js.Publish(ctx, subj, []byte(subj)); err != nil {
			t.Fatal(err)
		}
	}
	msg, err := c.Next(jetstream.FetchMaxWait(10 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if msg.Subject() != "capstan.exec.p.orders.refund" {
		t.Errorf("pool received %s", msg.Subject())
	}
}

func TestEnsurePool_DefaultsAckWaitAndMaxAckPending(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	env := testenv.Start(t)
	b := provision(t, env.Connect(t), broker.Config{})
	if _, err := b.EnsurePool(ctx, broker.PoolConfig{Pool: "p", Capabilities: []string{"a"}}); err != nil {
		t.Fatal(err)
	}
	cfg := consumerInfo(t, b, "pool-p").Config
	if cfg.AckWait != 30*time.Second || cfg.MaxAckPending != 1000 {
		t.Errorf("ack wait %v, max ack pending %d; want 30s, 1000", cfg.AckWait, cfg.MaxAckPending)
	}
}

func TestEnsurePool_SecondCallChangesNothing(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	env := testenv.Start(t)
	b := provision(t, env.Connect(t), broker.Config{})
	pc := broker.PoolConfig{Pool: "p", Capabilities: []string{"b", "a"}, MaxAckPending: 10, AckWait: time.Minute}
	if _, err := b.EnsurePool(ctx, pc); err != nil {
		t.Fatal(err)
	}
	before := consumerInfo(t, b, "pool-p")
	if _, err := b.EnsurePool(ctx, pc); err != nil {
		t.Fatal(err)
	}
	after := consumerInfo(t, b, "pool-p")
	if !reflect.DeepEqual(before.Config, after.Config) || !before.Created.Equal(after.Created) {
		t.Fatalf("second EnsurePool changed the consumer:\nbefore %+v\nafter  %+v", before.Config, after.Config)
	}
}

func TestEnsurePool_WidensAndNeverNarrows(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	env := testenv.Start(t)
	b := provision(t, env.Connect(t), broker.Config{})
	steps := []struct {
		caps []string
		want []string
	}{
		{[]string{"a"}, []string{"capstan.exec.*.a"}},
		{[]string{"b"}, []string{"capstan.exec.*.a", "capstan.exec.*.b"}},
		{[]string{"a"}, []string{"capstan.exec.*.a", "capstan.exec.*.b"}},
		{[]string{"c.d", "a"}, []string{"capstan.exec.*.a", "capstan.exec.*.b", "capstan.exec.*.c.d"}},
	}
	created := time.Time{}
	for i, s := range steps {
		if _, err := b.EnsurePool(ctx, broker.PoolConfig{Pool: "p", Capabilities: s.caps}); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		info := consumerInfo(t, b, "pool-p")
		if got := filters(info); !reflect.DeepEqual(got, s.want) {
			t.Fatalf("step %d (%v): filters %v, want %v", i, s.caps, got, s.want)
		}
		if i == 0 {
			created = info.Created
		} else if !info.Created.Equal(created) {
			t.Fatalf("step %d recreated the consumer", i)
		}
	}
}

// Widening keeps requests that were waiting for the old filter.
func TestEnsurePool_WideningKeepsPendingRequests(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	env := testenv.Start(t)
	js := env.JetStream(t)
	b := provision(t, env.Connect(t), broker.Config{})
	c, err := b.EnsurePool(ctx, broker.PoolConfig{Pool: "p", Capabilities: []string{"a"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, subj := range []string{"capstan.exec.p.a", "capstan.exec.p.b"} {
		if _, err := js.Publish(ctx, subj, []byte(subj)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.EnsurePool(ctx, broker.PoolConfig{Pool: "p", Capabilities: []string{"b"}}); err != nil {
		t.Fatal(err)
	}
	var got []string
	for range 2 {
		msg, err := c.Next(jetstream.FetchMaxWait(10 * time.Second))
		if err != nil {
			t.Fatalf("after %v: %v", got, err)
		}
		got = append(got, msg.Subject())
		if err := msg.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
	}
	slices.Sort(got)
	if !reflect.DeepEqual(got, []string{"capstan.exec.p.a", "capstan.exec.p.b"}) {
		t.Fatalf("pool received %v", got)
	}
}

func TestEnsurePool_MaxAckPendingNeverDecreases(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	env := testenv.Start(t)
	b := provision(t, env.Connect(t), broker.Config{})
	for i, s := range []struct{ ask, want int }{{100, 100}, {10, 100}, {250, 250}, {1, 250}} {
		if _, err := b.EnsurePool(ctx, broker.PoolConfig{Pool: "p", Capabilities: []string{"a"}, MaxAckPending: s.ask}); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if got := consumerInfo(t, b, "pool-p").Config.MaxAckPending; got != s.want {
			t.Fatalf("step %d asked %d: max ack pending %d, want %d", i, s.ask, got, s.want)
		}
	}
}

func TestEnsurePool_OverlappingPoolsConflict(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	env := testenv.Start(t)
	b := provision(t, env.Connect(t), broker.Config{})
	if _, err := b.EnsurePool(ctx, broker.PoolConfig{Pool: "one", Capabilities: []string{"a", "b"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.EnsurePool(ctx, broker.PoolConfig{Pool: "two", Capabilities: []string{"c"}}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		pc   broker.PoolConfig
	}{
		{"new pool taking a served capability", broker.PoolConfig{Pool: "three", Capabilities: []string{"z", "b"}}},
		{"existing pool widening onto a served capability", broker.PoolConfig{Pool: "two", Capabilities: []string{"a"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := b.EnsurePool(ctx, tc.pc)
			if !errors.Is(err, broker.ErrConfigConflict) {
				t.Fatalf("EnsurePool(%+v): %v, want ErrConfigConflict", tc.pc, err)
			}
			t.Logf("EnsurePool: %v", err)
			for _, want := range []string{"pool-" + tc.pc.Pool, "served by one pool only"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
		})
	}
	// The refused calls left every pool as it was.
	if got := filters(consumerInfo(t, b, "pool-one")); !reflect.DeepEqual(got, []string{"capstan.exec.*.a", "capstan.exec.*.b"}) {
		t.Errorf("pool-one filters %v", got)
	}
	if got := filters(consumerInfo(t, b, "pool-two")); !reflect.DeepEqual(got, []string{"capstan.exec.*.c"}) {
		t.Errorf("pool-two filters %v", got)
	}
	if _, err := b.Exec.Consumer(ctx, "pool-three"); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Errorf("refused pool-three exists: %v", err)
	}
}

// Workers of one pool start at the same moment, each with a capability the
// others lack; the filter ends as the union of all of them, every time. (One
// connection serves all goroutines: the race is in JetStream, not the client.)
func TestEnsurePool_ConcurrentWideningKeepsEveryCapability(t *testing.T) {
	t.Parallel()
	onEveryStore(t, func(t *testing.T, b *broker.Broker) {
		ctx := testCtx(t)
		const workers = 8
		rounds := 5
		if b.Config.Replicas > 1 {
			rounds = 2 // the same race, slower to run on a cluster
		}
		for round := range rounds {
			pool := fmt.Sprintf("r%d", round)
			var want []string
			errs := make(chan error, workers)
			var wg sync.WaitGroup
			for i := range workers {
				capability := fmt.Sprintf("%s.cap%d", pool, i)
				want = append(want, "capstan.exec.*."+capability)
				wg.Go(func() {
					_, err := b.EnsurePool(ctx, broker.PoolConfig{Pool: pool, Capabilities: []string{capability}, MaxAckPending: 10 + i})
					errs <- err
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatalf("round %d: %v", round, err)
				}
			}
			slices.Sort(want)
			info := consumerInfo(t, b, "pool-"+pool)
			if got := filters(info); !reflect.DeepEqual(got, want) {
				t.Fatalf("round %d: filters %v, want %v", round, got, want)
			}
			if got := info.Config.MaxAckPending; got != 10+workers-1 {
				t.Errorf("round %d: max ack pending %d, want the largest asked, %d", round, got, 10+workers-1)
			}
		}
	})
}

func TestEnsureUnrouted_FiltersOnTheUnroutedSubject(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	env := testenv.Start(t)
	for _, prefix := range []string{"", "TEAMA"} {
		b := provision(t, env.Connect(t), broker.Config{Prefix: prefix})
		c, err := b.EnsureUnrouted(ctx, 500, 20*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		info := consumerInfo(t, b, "_unrouted")
		want := []string{strings.ToLower(b.Names.ExecStream()[:len(b.Names.ExecStream())-len("_EXEC")]) + ".exec.*._unrouted"}
		if got := filters(info); !reflect.DeepEqual(got, want) || c.CachedInfo().Name != "_unrouted" {
			t.Errorf("prefix %q: consumer %s filters %v, want _unrouted on %v", prefix, c.CachedInfo().Name, got, want)
		}
		cfg := info.Config
		if cfg.MaxDeliver != -1 || cfg.AckPolicy != jetstream.AckExplicitPolicy || cfg.MaxAckPending != 500 || cfg.AckWait != 20*time.Second {
			t.Errorf("prefix %q: %+v", prefix, cfg)
		}
		// Every worker calls it; the second call is a no-op.
		if _, err := b.EnsureUnrouted(ctx, 500, 20*time.Second); err != nil {
			t.Fatal(err)
		}
		if again := consumerInfo(t, b, "_unrouted"); !again.Created.Equal(info.Created) || !reflect.DeepEqual(again.Config, cfg) {
			t.Errorf("prefix %q: second EnsureUnrouted changed the consumer", prefix)
		}
	}
}

// JetStream rewrites a consumer without a revision check, so a widening that
// read the filter before another worker's widening writes it back without that
// worker's capability. The pools bucket remembers it, and the next round of
// the stale writer, or any later EnsurePool, puts it back.
func TestEnsurePool_RestoresACapabilityAStaleWriteDropped(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	env := testenv.Start(t)
	b := provision(t, env.Connect(t), broker.Config{})
	for _, capability := range []string{"a", "x"} {
		if _, err := b.EnsurePool(ctx, broker.PoolConfig{Pool: "p", Capabilities: []string{capability}}); err != nil {
			t.Fatal(err)
		}
	}
	// A worker adding y read the filter when it was only [a]; its write lands now.
	stale := consumerInfo(t, b, "pool-p").Config
	stale.FilterSubjects = []string{"capstan.exec.*.a", "capstan.exec.*.y"}
	if _, err := b.Exec.UpdateConsumer(ctx, stale); err != nil {
		t.Fatal(err)
	}
	// Its read-back round finds its own subject there, and x missing from what
	// the pool asked for.
	if _, err := b.EnsurePool(ctx, broker.PoolConfig{Pool: "p", Capabilities: []string{"y"}}); err != nil {
		t.Fatal(err)
	}
	want := []string{"capstan.exec.*.a", "capstan.exec.*.x", "capstan.exec.*.y"}
	if got := filters(consumerInfo(t, b, "pool-p")); !reflect.DeepEqual(got, want) {
		t.Fatalf("filters %v, want %v", got, want)
	}
}

// Deleting a pool's consumer is how an operator narrows it or moves a
// capability to another pool: the consumer made again serves only what the
// workers starting now ask for.
func TestEnsurePool_RecreatedConsumerForgetsTheDeletedOnesFilter(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	env := testenv.Start(t)
	b := provision(t, env.Connect(t), broker.Config{})
	if _, err := b.EnsurePool(ctx, broker.PoolConfig{Pool: "p", Capabilities: []string{"a", "b"}, MaxAckPending: 500}); err != nil {
		t.Fatal(err)
	}
	if err := b.Exec.DeleteConsumer(ctx, "pool-p"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.EnsurePool(ctx, broker.PoolConfig{Pool: "p", Capabilities: []string{"a"}, MaxAckPending: 10}); err != nil {
		t.Fatal(err)
	}
	info := consumerInfo(t, b, "pool-p")
	if got := filters(info); !reflect.DeepEqual(got, []string{"capstan.exec.*.a"}) || info.Config.MaxAckPending != 10 {
		t.Fatalf("recreated consumer: filters %v, max ack pending %d; want [capstan.exec.a], 10", got, info.Config.MaxAckPending)
	}
	// b is free for another pool now.
	if _, err := b.EnsurePool(ctx, broker.PoolConfig{Pool: "q", Capabilities: []string{"b"}}); err != nil {
		t.Fatalf("moving b to pool q: %v", err)
	}
}

// A consumer made by hand with a single FilterSubject is widened like any other.
func TestEnsurePool_WidensASingleFilterSubject(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	env := testenv.Start(t)
	b := provision(t, env.Connect(t), broker.Config{})
	if _, err := b.Exec.CreateConsumer(ctx, jetstream.ConsumerConfig{
		Durable: "pool-p", AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: -1, FilterSubject: "capstan.exec.*.a",
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.EnsurePool(ctx, broker.PoolConfig{Pool: "p", Capabilities: []string{"b"}}); err != nil {
		t.Fatal(err)
	}
	if got := filters(consumerInfo(t, b, "pool-p")); !reflect.DeepEqual(got, []string{"capstan.exec.*.a", "capstan.exec.*.b"}) {
		t.Fatalf("filters %v", got)
	}
}

func TestEnsurePool_ConflictingConsumerNamesField(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		field string
		alter func(*jetstream.ConsumerConfig)
	}{
		{"MaxDeliver", func(c *jetstream.ConsumerConfig) { c.MaxDeliver = 5 }},
		{"DeliverSubject", func(c *jetstream.ConsumerConfig) { c.DeliverSubject = "push.here" }},
	} {
		t.Run(tc.field, func(t *testing.T) {
			ctx := testCtx(t)
			env := testenv.Start(t)
			b := provision(t, env.Connect(t), broker.Config{})
			cfg := jetstream.ConsumerConfig{
				Durable: "pool-p", AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: -1,
				FilterSubjects: []string{"capstan.exec.*.a"},
			}
			tc.alter(&cfg)
			if _, err := b.Exec.CreateConsumer(ctx, cfg); err != nil {
				t.Fatal(err)
			}
			before := consumerInfo(t, b, "pool-p")
			_, err := b.EnsurePool(ctx, broker.PoolConfig{Pool: "p", Capabilities: []string{"a", "b"}})
			if !errors.Is(err, broker.ErrConfigConflict) {
				t.Fatalf("EnsurePool over a consumer with another %s: %v, want ErrConfigConflict", tc.field, err)
			}
			t.Logf("EnsurePool: %v", err)
			for _, want := range []string{"pool-p", tc.field} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not name %q", err, want)
				}
			}
			if after := consumerInfo(t, b, "pool-p"); !reflect.DeepEqual(before.Config, after.Config) {
				t.Errorf("EnsurePool changed the conflicting consumer: %+v", after.Config)
			}
		})
	}
}

func TestEnsurePool_RefusesFiltersThatWouldTakeOtherCapabilities(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	env := testenv.Start(t)
	b := provision(t, env.Connect(t), broker.Config{})
	for _, caps := range [][]string{nil, {"orders.>"}, {"a", "*"}, {"_unrouted"}, {"orders..refund"}, {"Orders"}} {
		if _, err := b.EnsurePool(ctx, broker.PoolConfig{Pool: "p", Capabilities: caps}); err == nil {
			t.Errorf("EnsurePool with capabilities %q succeeded", caps)
		} else {
			t.Logf("%q: %v", caps, err)
		}
	}
	if _, err := b.Exec.Consumer(ctx, "pool-p"); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Fatalf("a refused EnsurePool made pool-p: %v", err)
	}
}
