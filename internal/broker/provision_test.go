package broker_test

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// snapshot is what provisioning must leave untouched: every stream's config and
// creation time, keyed by stream name.
type snapshot map[string]struct {
	cfg     jetstream.StreamConfig
	created time.Time
}

func takeSnapshot(t *testing.T, ctx context.Context, js jetstream.JetStream, n broker.Names) snapshot {
	t.Helper()
	s := snapshot{}
	for _, name := range n.Streams() {
		st, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatalf("stream %s: %v", name, err)
		}
		info, err := st.Info(ctx)
		if err != nil {
			t.Fatalf("stream %s info: %v", name, err)
		}
		s[name] = struct {
			cfg     jetstream.StreamConfig
			created time.Time
		}{info.Config, info.Created}
	}
	return s
}

func TestProvision_TwiceIsNoOp(t *testing.T) {
	t.Parallel()
	onEveryStore(t, func(t *testing.T, first *broker.Broker) {
		ctx := testCtx(t)
		js := first.JS
		before := takeSnapshot(t, ctx, js, first.Names)
		second, err := broker.Provision(ctx, first.NC, first.Config)
		if err != nil {
			t.Fatalf("second provision: %v", err)
		}
		after := takeSnapshot(t, ctx, js, second.Names)

		if !reflect.DeepEqual(before, after) {
			t.Fatalf("second provision changed resources:\nbefore %+v\nafter  %+v", before, after)
		}
		for _, pair := range [][2]string{
			{first.Exec.CachedInfo().Config.Name, second.Exec.CachedInfo().Config.Name},
			{first.Audit.CachedInfo().Config.Name, second.Audit.CachedInfo().Config.Name},
			{first.Executions.Bucket(), second.Executions.Bucket()},
			{first.Envelopes.Bucket(), second.Envelopes.Bucket()},
			{first.Approvals.Bucket(), second.Approvals.Bucket()},
			{first.Catalog.Bucket(), second.Catalog.Bucket()},
			{first.Pools.Bucket(), second.Pools.Bucket()},
		} {
			if pair[0] != pair[1] || pair[0] == "" {
				t.Errorf("second provision returned %q, first %q", pair[1], pair[0])
			}
		}
		// The handles the second call returned work on the same data.
		if _, err := second.Catalog.Put(ctx, "demo.echo", []byte("x")); err != nil {
			t.Fatal(err)
		}
		// On R3 a bucket's get is a direct get, which any replica answers: a
		// follower that has not yet applied the write says "not found" for
		// a moment. The handles share the data once every replica has it.
		for {
			e, err := first.Catalog.Get(ctx, "demo.echo")
			if err == nil && string(e.Value()) == "x" {
				break
			}
			if ctx.Err() != nil || (err != nil && !errors.Is(err, jetstream.ErrKeyNotFound)) {
				t.Fatalf("first handle reads %v, %v; want the second handle's write", e, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}

// Every process provisions at start, often at the same moment.
func TestProvision_ConcurrentCallsAllSucceed(t *testing.T) {
	t.Parallel()
	for _, store := range []struct {
		name     string
		replicas int
		start    func(t *testing.T) func(t *testing.T) *nats.Conn
	}{
		{"R1", 1, func(t *testing.T) func(t *testing.T) *nats.Conn {
			env := testenv.Start(t)
			return func(t *testing.T) *nats.Conn { return env.Connect(t) }
		}},
		{"R3", 3, func(t *testing.T) func(t *testing.T) *nats.Conn {
			c := testenv.StartCluster(t, 3)
			return func(t *testing.T) *nats.Conn { return c.Connect(t) }
		}},
	} {
		t.Run(store.name, func(t *testing.T) {
			t.Parallel()
			ctx := testCtx(t)
			connect := store.start(t)
			const n = 6
			errs := make(chan error, n)
			var wg sync.WaitGroup
			for range n {
				nc := connect(t)
				wg.Go(func() {
					_, err := broker.Provision(ctx, nc, broker.Config{Replicas: store.replicas})
					errs <- err
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Errorf("concurrent provision: %v", err)
				}
			}
		})
	}
}

func TestProvision_CreatesTheDesignedResources(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	env := testenv.Start(t)
	b := provision(t, env.Connect(t), broker.Config{})

	exec := b.Exec.CachedInfo().Config
	if exec.Name != "CAPSTAN_EXEC" || !reflect.DeepEqual(exec.Subjects, []string{"capstan.exec.>"}) ||
		exec.Retention != jetstream.WorkQueuePolicy || exec.Storage != jetstream.FileStorage ||
		exec.Duplicates < 2*time.Minute || exec.Replicas != 1 ||
		exec.Discard != jetstream.DiscardNew || exec.MaxBytes != broker.DefaultQueueMaxBytes {
		t.Errorf("exec stream: %+v", exec)
	}
	audit := b.Audit.CachedInfo().Config
	if audit.Name != "CAPSTAN_AUDIT" || !reflect.DeepEqual(audit.Subjects, []string{"capstan.audit.>"}) ||
		audit.Retention != jetstream.LimitsPolicy || audit.MaxAge != broker.DefaultAuditMaxAge ||
		audit.Discard != jetstream.DiscardOld {
		t.Errorf("audit stream: %+v", audit)
	}
	for _, kv := range []struct {
		kv      jetstream.KeyValue
		name    string
		ttl     time.Duration
		publish bool
	}{
		{b.Executions, "CAPSTAN_EXECUTIONS", broker.DefaultRecordTTL, false},
		{b.Envelopes, "CAPSTAN_ENVELOPES", broker.DefaultEnvelopeRetention, true},
		{b.Approvals, "CAPSTAN_APPROVALS", broker.DefaultRecordTTL, false},
		{b.Catalog, "CAPSTAN_CATALOG", 0, false},
		{b.Pools, "CAPSTAN_POOLS", 0, false},
	} {
		st, err := kv.kv.Status(ctx)
		if err != nil {
			t.Fatalf("%s status: %v", kv.name, err)
		}
		cfg := st.(*jetstream.KeyValueBucketStatus).StreamInfo().Config
		if kv.kv.Bucket() != kv.name || st.History() != 1 || st.TTL() != kv.ttl ||
			cfg.Storage != jetstream.FileStorage || (cfg.RePublish != nil) != kv.publish {
			t.Errorf("bucket %s: history %d, ttl %v, config %+v", kv.name, st.History(), st.TTL(), cfg)
		}
	}
}

func TestProvision_DedupWindowNeverBelowTwoMinutes(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	b := provision(t, env.Connect(t), broker.Config{DedupWindow: time.Second})
	if got := b.Exec.CachedInfo().Config.Duplicates; got != broker.DefaultDedupWindow {
		t.Fatalf("dedup window %v, want %v", got, broker.DefaultDedupWindow)
	}
}

// An exec stream from a version that kept requests for ever is given the
// record TTL as its MaxAge: a request never outlives its record (DESIGN §13).
// Nothing else about it changes.
func TestProvision_ExecStreamWithoutMaxAgeGetsTheRecordTTL(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	nc := env.Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	old := capstanExec(func(c *jetstream.StreamConfig) { c.MaxAge = 0 })
	if err := stream(old)(testCtx(t), js); err != nil {
		t.Fatal(err)
	}
	b := provision(t, nc, broker.Config{})
	got := b.Exec.CachedInfo().Config
	if got.MaxAge != broker.DefaultRecordTTL {
		t.Fatalf("exec stream MaxAge %v, want the record TTL %v", got.MaxAge, broker.DefaultRecordTTL)
	}
	if got.Duplicates != old.Duplicates || got.Retention != old.Retention || !slices.Equal(got.Subjects, old.Subjects) {
		t.Fatalf("exec stream changed beyond MaxAge: %+v", got)
	}
}

// conflictCase pre-creates one resource with a config that differs from
// capstan's in one field, and names what the error must say.
type conflictCase struct {
	name     string
	resource string // the name the error must carry
	field    string // the field the error must carry
	setup    func(ctx context.Context, js jetstream.JetStream) error
}

func stream(cfg jetstream.StreamConfig) func(context.Context, jetstream.JetStream) error {
	return func(ctx context.Context, js jetstream.JetStream) error {
		_, err := js.CreateStream(ctx, cfg)
		return err
	}
}

func bucket(cfg jetstream.KeyValueConfig) func(context.Context, jetstream.JetStream) error {
	return func(ctx context.Context, js jetstream.JetStream) error {
		_, err := js.CreateKeyValue(ctx, cfg)
		return err
	}
}

// capstanExec is CAPSTAN_EXEC as earlier versions made it (unbounded), for
// cases to alter.
func capstanExec(alter func(*jetstream.StreamConfig)) jetstream.StreamConfig {
	c := jetstream.StreamConfig{
		Name:       "CAPSTAN_EXEC",
		Subjects:   []string{"capstan.exec.>"},
		Retention:  jetstream.WorkQueuePolicy,
		Storage:    jetstream.FileStorage,
		Duplicates: broker.DefaultDedupWindow,
		MaxAge:     broker.DefaultRecordTTL,
	}
	alter(&c)
	return c
}

func capstanAudit(alter func(*jetstream.StreamConfig)) jetstream.StreamConfig {
	c := jetstream.StreamConfig{
		Name:      "CAPSTAN_AUDIT",
		Subjects:  []string{"capstan.audit.>"},
		Retention: jetstream.LimitsPolicy,
		Storage:   jetstream.FileStorage,
		MaxAge:    broker.DefaultAuditMaxAge,
	}
	alter(&c)
	return c
}

func capstanBucket(name string, ttl time.Duration, alter func(*jetstream.KeyValueConfig)) jetstream.KeyValueConfig {
	c := jetstream.KeyValueConfig{Bucket: name, History: 1, TTL: ttl, Storage: jetstream.FileStorage}
	if name == "CAPSTAN_ENVELOPES" {
		c.RePublish = &jetstream.RePublish{Source: "$KV.CAPSTAN_ENVELOPES.>", Destination: "capstan.envelope.>"}
	}
	alter(&c)
	return c
}

func TestProvision_ConflictingStreamNamesField(t *testing.T) {
	t.Parallel()
	week := broker.DefaultRecordTTL
	for _, tc := range []conflictCase{
		{"exec with limits retention", "CAPSTAN_EXEC", "Retention",
			stream(capstanExec(func(c *jetstream.StreamConfig) { c.Retention = jetstream.LimitsPolicy }))},
		{"exec with interest retention", "CAPSTAN_EXEC", "Retention",
			stream(capstanExec(func(c *jetstream.StreamConfig) { c.Retention = jetstream.InterestPolicy }))},
		{"exec with a 5 min dedup window", "CAPSTAN_EXEC", "Duplicates",
			stream(capstanExec(func(c *jetstream.StreamConfig) { c.Duplicates = 5 * time.Minute }))},
		{"exec with narrower subjects", "CAPSTAN_EXEC", "Subjects",
			stream(capstanExec(func(c *jetstream.StreamConfig) { c.Subjects = []string{"capstan.exec.demo.>"} }))},
		{"exec in memory", "CAPSTAN_EXEC", "Storage",
			stream(capstanExec(func(c *jetstream.StreamConfig) { c.Storage = jetstream.MemoryStorage }))},
		{"exec with a max age", "CAPSTAN_EXEC", "MaxAge",
			stream(capstanExec(func(c *jetstream.StreamConfig) { c.MaxAge = time.Hour }))},
		// Capped while discarding the oldest: a full stream would drop
		// stored requests without a word.
		{"exec capped at 100 requests", "CAPSTAN_EXEC", "MaxMsgs",
			stream(capstanExec(func(c *jetstream.StreamConfig) { c.MaxMsgs = 100 }))},
		{"exec capped in bytes", "CAPSTAN_EXEC", "MaxBytes",
			stream(capstanExec(func(c *jetstream.StreamConfig) { c.MaxBytes = 1 << 20 }))},
		{"exec keeping one request per capability", "CAPSTAN_EXEC", "MaxMsgsPerSubject",
			stream(capstanExec(func(c *jetstream.StreamConfig) { c.MaxMsgsPerSubject = 1 }))},
		{"audit with work-queue retention", "CAPSTAN_AUDIT", "Retention",
			stream(capstanAudit(func(c *jetstream.StreamConfig) { c.Retention = jetstream.WorkQueuePolicy }))},
		{"audit capped in bytes", "CAPSTAN_AUDIT", "MaxBytes",
			stream(capstanAudit(func(c *jetstream.StreamConfig) { c.MaxBytes = 1 << 20 }))},

		{"envelopes with history 5", "CAPSTAN_ENVELOPES", "History",
			bucket(capstanBucket("CAPSTAN_ENVELOPES", week, func(c *jetstream.KeyValueConfig) { c.History = 5 }))},
		{"envelopes without republish", "CAPSTAN_ENVELOPES", "RePublish",
			bucket(capstanBucket("CAPSTAN_ENVELOPES", week, func(c *jetstream.KeyValueConfig) { c.RePublish = nil }))},
		{"envelopes republished elsewhere", "CAPSTAN_ENVELOPES", "RePublish",
			bucket(capstanBucket("CAPSTAN_ENVELOPES", week, func(c *jetstream.KeyValueConfig) {
				c.RePublish = &jetstream.RePublish{Source: "$KV.CAPSTAN_ENVELOPES.>", Destination: "other.>"}
			}))},
		{"executions in memory", "CAPSTAN_EXECUTIONS", "Storage",
			bucket(capstanBucket("CAPSTAN_EXECUTIONS", week, func(c *jetstream.KeyValueConfig) { c.Storage = jetstream.MemoryStorage }))},
		{"approvals without TTL", "CAPSTAN_APPROVALS", "TTL",
			bucket(capstanBucket("CAPSTAN_APPROVALS", week, func(c *jetstream.KeyValueConfig) { c.TTL = 0 }))},
		{"catalog with a TTL", "CAPSTAN_CATALOG", "TTL",
			bucket(capstanBucket("CAPSTAN_CATALOG", 0, func(c *jetstream.KeyValueConfig) { c.TTL = time.Hour }))},
		{"catalog with history 3", "CAPSTAN_CATALOG", "History",
			bucket(capstanBucket("CAPSTAN_CATALOG", 0, func(c *jetstream.KeyValueConfig) { c.History = 3 }))},
		{"pools with a TTL", "CAPSTAN_POOLS", "TTL",
			bucket(capstanBucket("CAPSTAN_POOLS", 0, func(c *jetstream.KeyValueConfig) { c.TTL = time.Hour }))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			env := testenv.Start(t)
			js := env.JetStream(t)
			if err := tc.setup(ctx, js); err != nil {
				t.Fatalf("pre-create: %v", err)
			}
			before := streamInfo(t, ctx, js, tc.resource)

			_, err := broker.Provision(ctx, env.Connect(t), broker.Config{})
			if !errors.Is(err, broker.ErrConfigConflict) {
				t.Fatalf("provision over a conflicting %s: %v, want ErrConfigConflict", tc.resource, err)
			}
			t.Logf("provision: %v", err)
			for _, want := range []string{tc.resource, tc.field} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not name %q", err, want)
				}
			}
			after := streamInfo(t, ctx, js, tc.resource)
			if !reflect.DeepEqual(before.Config, after.Config) || !before.Created.Equal(after.Created) {
				t.Errorf("provision changed the conflicting resource:\nbefore %+v\nafter  %+v", before.Config, after.Config)
			}
		})
	}
}

// streamInfo reads a stream, or the stream behind a bucket.
func streamInfo(t *testing.T, ctx context.Context, js jetstream.JetStream, name string) *jetstream.StreamInfo {
	t.Helper()
	if !strings.HasSuffix(name, "_EXEC") && !strings.HasSuffix(name, "_AUDIT") {
		name = "KV_" + name
	}
	s, err := js.Stream(ctx, name)
	if err != nil {
		t.Fatalf("stream %s: %v", name, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatalf("stream %s info: %v", name, err)
	}
	return info
}

func TestProvision_PrefixNamesEveryResource(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	env := testenv.Start(t)
	js := env.JetStream(t)
	a := provision(t, env.Connect(t), broker.Config{Prefix: "TEAMA"})

	if got := a.Exec.CachedInfo().Config; got.Name != "TEAMA_EXEC" || !reflect.DeepEqual(got.Subjects, []string{"teama.exec.>"}) {
		t.Errorf("exec stream %s on %v, want TEAMA_EXEC on [teama.exec.>]", got.Name, got.Subjects)
	}
	if got := a.Audit.CachedInfo().Config; got.Name != "TEAMA_AUDIT" || !reflect.DeepEqual(got.Subjects, []string{"teama.audit.>"}) {
		t.Errorf("audit stream %s on %v, want TEAMA_AUDIT on [teama.audit.>]", got.Name, got.Subjects)
	}
	for _, kv := range []struct {
		kv   jetstream.KeyValue
		want string
	}{
		{a.Executions, "TEAMA_EXECUTIONS"}, {a.Envelopes, "TEAMA_ENVELOPES"}, {a.Approvals, "TEAMA_APPROVALS"},
		{a.Catalog, "TEAMA_CATALOG"}, {a.Pools, "TEAMA_POOLS"},
	} {
		if kv.kv.Bucket() != kv.want {
			t.Errorf("bucket %s, want %s", kv.kv.Bucket(), kv.want)
		}
	}
	names := map[string]bool{}
	for name := range js.StreamNames(ctx).Name() {
		names[name] = true
	}
	for name := range names {
		if !strings.Contains(name, "TEAMA_") {
			t.Errorf("stream %s outside the prefix", name)
		}
	}
	if len(names) != 11 {
		t.Errorf("streams %v, want the 11 TEAMA ones", names)
	}
}

func TestProvision_TwoPrefixesCoexistOnOneServer(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	env := testenv.Start(t)
	nc := env.Connect(t)
	def := provision(t, nc, broker.Config{})
	a := provision(t, nc, broker.Config{Prefix: "TEAMA"})
	// Both again: each is still a no-op beside the other.
	provision(t, nc, broker.Config{})
	provision(t, nc, broker.Config{Prefix: "TEAMA"})

	// A request and an envelope under one prefix stay under it.
	js := env.JetStream(t)
	if _, err := js.Publish(ctx, a.Names.ExecSubject(broker.Anonymous, "demo.echo"), []byte("a")); err != nil {
		t.Fatal(err)
	}
	if _, err := broker.Create(ctx, a.Envelopes, "e1", map[string]string{"from": "teama"}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		b        *broker.Broker
		execMsgs uint64
	}{{def, 0}, {a, 1}} {
		info, err := c.b.Exec.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Msgs != c.execMsgs {
			t.Errorf("%s holds %d requests, want %d", info.Config.Name, info.State.Msgs, c.execMsgs)
		}
	}
	if _, _, err := broker.Load[map[string]string](ctx, def.Envelopes, "e1"); !errors.Is(err, broker.ErrNotFound) {
		t.Errorf("default prefix sees TEAMA's envelope: %v", err)
	}
	if v, _, err := broker.Load[map[string]string](ctx, a.Envelopes, "e1"); err != nil || (*v)["from"] != "teama" {
		t.Errorf("TEAMA envelope: %v, %v", v, err)
	}
}

// Every setting Provision takes is read back as the same setting, so a
// customised deployment provisions again without a false conflict; and a
// process started with other settings is told which one differs.
func TestProvision_CustomSettingsTwiceIsNoOpAndOtherSettingsConflict(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	env := testenv.Start(t)
	nc := env.Connect(t)
	custom := broker.Config{
		Prefix: "CUSTOM", RecordTTL: time.Hour, AuditMaxAge: 48 * time.Hour,
		AuditMaxBytes: 64 << 20, AuditDiscardNew: true, DedupWindow: 10 * time.Minute,
	}
	b := provision(t, nc, custom)
	before := takeSnapshot(t, ctx, b.JS, b.Names)
	provision(t, nc, custom)
	if after := takeSnapshot(t, ctx, b.JS, b.Names); !reflect.DeepEqual(before, after) {
		t.Fatalf("second provision changed resources:\nbefore %+v\nafter  %+v", before, after)
	}
	for _, tc := range []struct {
		field string
		alter func(*broker.Config)
	}{
		// The record TTL is also the exec stream's MaxAge, checked first.
		{"MaxAge", func(c *broker.Config) { c.RecordTTL = 2 * time.Hour }},
		{"MaxAge", func(c *broker.Config) { c.AuditMaxAge = 72 * time.Hour }},
		{"MaxBytes", func(c *broker.Config) { c.AuditMaxBytes = 0 }},
		{"Discard", func(c *broker.Config) { c.AuditDiscardNew = false }},
		{"Duplicates", func(c *broker.Config) { c.DedupWindow = 0 }},
	} {
		other := custom
		tc.alter(&other)
		_, err := broker.Provision(ctx, nc, other)
		if !errors.Is(err, broker.ErrConfigConflict) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("provision with another %s: %v, want ErrConfigConflict naming it", tc.field, err)
		}
	}
}

// The audit retention is the one setting only the process that sets it needs
// to know: asked for, it must match; unset, the stream's own is kept.
func TestProvision_AuditRetentionConflictsOnlyWhenAskedFor(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	env := testenv.Start(t)
	if _, err := env.JetStream(t).CreateStream(ctx, capstanAudit(func(c *jetstream.StreamConfig) { c.MaxAge = 24 * time.Hour })); err != nil {
		t.Fatal(err)
	}
	nc := env.Connect(t)
	_, err := broker.Provision(ctx, nc, broker.Config{AuditMaxAge: broker.DefaultAuditMaxAge})
	if !errors.Is(err, broker.ErrConfigConflict) || !strings.Contains(err.Error(), "CAPSTAN_AUDIT") || !strings.Contains(err.Error(), "MaxAge") {
		t.Fatalf("provision asking 30 days over a 1-day audit stream: %v, want ErrConfigConflict naming CAPSTAN_AUDIT and MaxAge", err)
	}
	b := provision(t, nc, broker.Config{})
	if got := b.Config.AuditMaxAge; got != 24*time.Hour {
		t.Fatalf("unset retention reads back as %v, want the stream's 24h", got)
	}
}
