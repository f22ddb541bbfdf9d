package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/envelope"
)

// ErrConfigConflict marks an existing resource whose configuration differs from
// what capstan needs. Provisioning never overwrites it.
var ErrConfigConflict = errors.New("capstan: existing resource conflicts")

// Defaults of Config.
const (
	DefaultRecordTTL   = 7 * 24 * time.Hour
	DefaultAuditMaxAge = 30 * 24 * time.Hour
	DefaultDedupWindow = 2 * time.Minute
	// DefaultEnvelopeRetention keeps an envelope a day and an hour: a
	// request may wait a day for its start (DESIGN §13, §16).
	DefaultEnvelopeRetention = 25 * time.Hour
	// DefaultRecordWindow is how long an execution record is kept after its
	// last write (DESIGN §16).
	DefaultRecordWindow = 15 * time.Minute
	// DefaultQueueMaxBytes is the most bytes one principal's queue holds
	// unless Config.QueueMaxBytes says otherwise.
	DefaultQueueMaxBytes = 1 << 30
)

// Config says how to provision. Zero values are the defaults.
type Config struct {
	// Prefix of every name (default "CAPSTAN"; subjects use it in lower case).
	Prefix string
	// Replicas of every stream and bucket. 0 is auto: a resource that exists
	// keeps the count it has, and a new one gets DetectReplicas' choice (3 on
	// a JetStream cluster of three or more servers, else 1). An explicit count
	// must match existing resources; SetReplicas is what changes it.
	Replicas int
	// ClusterSize, when known ahead, stands in for detection under auto: a
	// server knows the size of its cluster from its routes, and provisions R3
	// resources even while some of its peers are still starting.
	ClusterSize int
	// RecordTTL keeps execution records and approvals (default 7
	// days). It is also the exec stream's MaxAge: a request never outlives
	// the record of its execution (DESIGN §13).
	RecordTTL time.Duration
	// AuditMaxAge is the audit stream's retention. Unset, a new stream keeps
	// events 30 days and an existing one keeps the retention it was given, so
	// that only the process that sets it needs to know it.
	AuditMaxAge time.Duration
	// AuditMaxBytes caps the audit stream (0: unlimited). With AuditDiscardNew a
	// full stream refuses new events instead of dropping old ones.
	AuditMaxBytes int64
	// AuditDiscardNew makes a full audit stream refuse new events.
	AuditDiscardNew bool
	// DedupWindow is the exec stream's duplicate window (default and minimum 2
	// min, at most RecordTTL).
	DedupWindow time.Duration
	// EnvelopeRetention is how long an envelope is kept: the envelopes
	// bucket's TTL. Unset, a new bucket keeps envelopes
	// DefaultEnvelopeRetention and an existing one keeps the TTL it was
	// given; set, an existing bucket with another TTL is updated to it (an
	// operator's choice, logged). Clients cap a request's start window
	// below it (executor.MaxStartWithin).
	EnvelopeRetention time.Duration
	// Logger receives what provisioning changes. Default slog.Default().
	Logger *slog.Logger
	// QueueMaxBytes bounds the bytes one principal's queue of requests may
	// hold (DESIGN §3, §12 "Quotas"): the shared exec stream's MaxBytes,
	// which every principal's queue takes as its bound (a queuedBytes quota,
	// lower, bounds its own). 0: a new stream gets DefaultQueueMaxBytes and
	// an existing one keeps its own; -1: no bound. A full queue refuses
	// the request at its publication, never drops one stored.
	QueueMaxBytes int64
	// RecordWindow is how long an execution record outlives its last write
	// (default 15 min): every write of a worker carries it as the message's
	// TTL, so a finished execution's record goes RecordWindow after its last
	// write, and a running one, whose lease is renewed, stays (a write of an
	// execution not finalized carries at least what is left of its lease, so
	// a window shorter than the lease is safe). A deployment has one window
	// (DESIGN §16): the first worker records it (AgreeRecordWindow); a
	// worker set to another refuses to start, and one that sets none adopts
	// it.
	RecordWindow time.Duration
}

func (c Config) withDefaults() Config {
	if c.RecordTTL <= 0 {
		c.RecordTTL = DefaultRecordTTL
	}
	if c.AuditMaxAge <= 0 {
		c.AuditMaxAge = DefaultAuditMaxAge
	}
	if c.DedupWindow < DefaultDedupWindow {
		c.DedupWindow = DefaultDedupWindow
	}
	// JetStream keeps no duplicate window longer than the stream's MaxAge.
	c.DedupWindow = min(c.DedupWindow, c.RecordTTL)
	if c.EnvelopeRetention <= 0 {
		c.EnvelopeRetention = DefaultEnvelopeRetention
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.RecordWindow <= 0 {
		c.RecordWindow = DefaultRecordWindow
	}
	// A per-message TTL is whole seconds, and never beyond the bucket's age.
	c.RecordWindow = min(max(c.RecordWindow, time.Second), c.RecordTTL)
	return c
}

// MaxStartWithin is the longest a request may wait for its start when
// envelopes are kept retention: the retention less a margin of an hour (a
// tenth of it, under ten hours). Clients cap a request's start window at it;
// workers refuse a request whose id is older (DESIGN §16).
func MaxStartWithin(retention time.Duration) time.Duration {
	return retention - min(time.Hour, retention/10)
}

// Broker holds the provisioned resources.
type Broker struct {
	// NC and JS are the connection and its JetStream API.
	NC *nats.Conn
	JS jetstream.JetStream // NC's JetStream API
	// Names names the resources; Config is what they were opened with.
	Names  Names
	Config Config // the Config given, defaults applied; Provision fills in the retentions the server holds
	// Replicas is the exec stream's replica count, as found or created.
	Replicas int
	// clustered is set once NC was seen connected to a cluster (ReadsMayLag).
	clustered atomic.Bool

	// Exec is the stream of execution requests; Audit the audit trail's.
	Exec  jetstream.Stream
	Audit jetstream.Stream // nil after Open (see Open)
	// Index is the executions index (DESIGN §3): what listings read.
	Index jetstream.Stream
	// Executions holds the execution records, Envelopes the results,
	// Approvals the approvals, Catalog the capabilities workers serve. Open
	// leaves the handles a client does not read nil (see Open).
	Executions jetstream.KeyValue
	Envelopes  jetstream.KeyValue // see Executions
	Approvals  jetstream.KeyValue // see Executions
	Catalog    jetstream.KeyValue // see Executions
	// Pools records what the workers of each pool asked of its consumer, so
	// that concurrent widenings never lose a capability (see EnsurePool).
	Pools jetstream.KeyValue
	// Limits holds the counters of capabilities' limits (DESIGN §17):
	// concurrency slots, rates and budgets, changed by compare-and-swap.
	Limits jetstream.KeyValue
	// Trail holds the audit log's tree (its tiles) and Checkpoints its
	// signed checkpoints (DESIGN §8, "The trail as a log"); OpenAll leaves
	// them nil on a store no process of this version provisioned.
	Trail       jetstream.KeyValue
	Checkpoints jetstream.Stream // see Trail
}

// Provision creates every stream and bucket of the design, or checks that the
// existing ones match. It is idempotent and safe to call from every process at
// start. A conflicting existing resource fails with ErrConfigConflict and a
// message naming the resource and the field.
func Provision(ctx context.Context, nc *nats.Conn, cfg Config) (*Broker, error) {
	keepAuditMaxAge := cfg.AuditMaxAge <= 0
	keepEnvelopeRetention := cfg.EnvelopeRetention <= 0
	cfg = cfg.withDefaults()
	if err := checkReplicas(cfg.Replicas, true); err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(AsyncAckTimeout))
	if err != nil {
		return nil, err
	}
	n := NewNames(cfg.Prefix)
	b := &Broker{NC: nc, JS: js, Names: n, Config: cfg}
	rc := &replicaChoice{nc: nc, explicit: cfg.Replicas, clusterSize: cfg.ClusterSize}
	js = resending{js}

	if b.Exec, err = ensureExec(ctx, js, rc, n, cfg); err != nil {
		return nil, err
	}
	b.Replicas = b.Exec.CachedInfo().Config.Replicas
	discard := jetstream.DiscardOld
	if cfg.AuditDiscardNew {
		discard = jetstream.DiscardNew
	}
	auditMaxBytes := cfg.AuditMaxBytes
	if auditMaxBytes == 0 {
		auditMaxBytes = -1
	}
	auditStream := trailStream(n.AuditStream(), n.AuditSubjects(), cfg.AuditMaxAge)
	auditStream.MaxBytes = auditMaxBytes
	auditStream.Discard = discard
	// Workers publish events as one long fast batch, which the stream
	// acknowledges every few hundred messages instead of each one.
	auditStream.AllowBatchPublish = true
	b.Audit, err = ensureStream(ctx, js, rc, auditStream, keepAuditMaxAge)
	if err != nil {
		return nil, err
	}
	b.Config.AuditMaxAge = b.Audit.CachedInfo().Config.MaxAge
	b.Index, err = ensureStream(ctx, js, rc, IndexConfig(n, b.Config.AuditMaxAge), keepAuditMaxAge)
	if err != nil {
		return nil, err
	}
	// Envelopes are republished once stored: a client's one subscription sees
	// only envelopes JetStream accepted, never a refused second finalization.
	envelopesRepublish := &jetstream.RePublish{
		Source:      "$KV." + n.EnvelopesBucket() + ".>",
		Destination: n.EnvelopeSubjects(),
	}
	b.Envelopes, b.Config.EnvelopeRetention, err = ensureEnvelopes(ctx, js, rc, jetstream.KeyValueConfig{
		Bucket: n.EnvelopesBucket(), History: 1, TTL: cfg.EnvelopeRetention,
		Storage: jetstream.FileStorage, RePublish: envelopesRepublish,
	}, keepEnvelopeRetention, cfg.Logger)
	if err != nil {
		return nil, err
	}
	for _, kv := range []struct {
		dst       *jetstream.KeyValue
		name      string
		ttl       time.Duration
		republish *jetstream.RePublish
	}{
		{&b.Executions, n.ExecutionsBucket(), cfg.RecordTTL, nil},
		{&b.Approvals, n.ApprovalsBucket(), cfg.RecordTTL, nil},
		{&b.Catalog, n.CatalogBucket(), 0, nil},
		{&b.Pools, n.PoolsBucket(), 0, nil},
		{&b.Limits, n.LimitsBucket(), 0, nil},
	} {
		*kv.dst, err = ensureBucket(ctx, js, rc, jetstream.KeyValueConfig{
			Bucket:    kv.name,
			History:   1,
			TTL:       kv.ttl,
			Storage:   jetstream.FileStorage,
			RePublish: kv.republish,
		})
		if err != nil {
			return nil, err
		}
	}
	b.Trail, err = ensureBucket(ctx, js, rc, jetstream.KeyValueConfig{
		Bucket: n.TrailBucket(), History: 1, Storage: jetstream.FileStorage})
	if err != nil {
		return nil, err
	}
	b.Checkpoints, err = ensureStream(ctx, js, rc, checkpointsConfig(n, b.Config.AuditMaxAge), keepAuditMaxAge)
	if err != nil {
		return nil, err
	}
	// Records and limits' counters carry their own TTL (DESIGN §16, §17).
	for _, bucket := range []string{n.ExecutionsBucket(), n.LimitsBucket()} {
		if err := allowMsgTTL(ctx, js, "KV_"+bucket); err != nil {
			return nil, err
		}
	}
	if err := b.publishResources(ctx); err != nil {
		return nil, err
	}
	return b, nil
}

// trailStream is the configuration of a stream of the trail (the audit
// events, their index, the checkpoints): the trail is evidence, so no
// process, whatever its rights, removes a message; what one execution left
// is read with batched direct gets, without a consumer (audit.Read).
func trailStream(name, subjects string, maxAge time.Duration) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        name,
		Subjects:    []string{subjects},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		MaxAge:      maxAge,
		Discard:     jetstream.DiscardOld,
		DenyDelete:  true,
		DenyPurge:   true,
		AllowDirect: true,
	}
}

// IndexConfig is the executions index's stream: kept as long as the trail it
// indexes, removed by nobody, read with direct gets, written in fast batches.
func IndexConfig(n Names, maxAge time.Duration) jetstream.StreamConfig {
	c := trailStream(n.IndexStream(), n.IndexSubjects(), maxAge)
	c.AllowBatchPublish = true
	return c
}

// checkpointsConfig is the checkpoints' stream: removed by nobody, kept a
// day longer than the audit events (auditMaxAge; 0 keeps both for ever),
// so that the checkpoints around the oldest retained event still date
// what retention removed.
func checkpointsConfig(n Names, auditMaxAge time.Duration) jetstream.StreamConfig {
	maxAge := time.Duration(0)
	if auditMaxAge > 0 {
		maxAge = auditMaxAge + 24*time.Hour
	}
	return trailStream(n.CheckpointStream(), n.CheckpointSubject(), maxAge)
}

// ResourcesKey is the catalog key under which provisioning records what
// clients must know of the buckets they may not inspect (a producer may not
// ask for their stream information): capability ids never start with "_".
const ResourcesKey = "_resources"

// resources is the value under ResourcesKey.
type resources struct {
	V int `json:"v"`
	// EnvelopeRetentionMs is the envelopes bucket's TTL.
	EnvelopeRetentionMs int64 `json:"envelopeRetentionMs"`
	// RecordWindowMs is the deployment's record window, once its first
	// worker recorded it (0: none yet).
	RecordWindowMs int64 `json:"recordWindowMs,omitempty"`
}

// publishResources records the resources' facts for clients, when they
// changed, keeping the record window recorded there.
func (b *Broker) publishResources(ctx context.Context) error {
	return b.changeResources(ctx, func(r *resources) error {
		r.EnvelopeRetentionMs = b.Config.EnvelopeRetention.Milliseconds()
		return nil
	})
}

// changeResources applies change to the resources' record by
// compare-and-swap (creating it when there is none), reading it again when
// another process changed it meanwhile. A change that leaves it as it was
// writes nothing.
func (b *Broker) changeResources(ctx context.Context, change func(r *resources) error) error {
	var err error
	for try := 0; try < 60; try++ {
		if try > 0 {
			// Another process wrote it meanwhile, or the bucket was not
			// ready to answer (a replicated one just created elects its
			// leader): read it again.
			select {
			case <-ctx.Done():
				return fmt.Errorf("capstan: bucket %s: record %s: %w (%w)", b.Names.CatalogBucket(), ResourcesKey, ctx.Err(), err)
			case <-time.After(Backoff(try)):
			}
		}
		have, rev, lerr := Load[resources](ctx, b.Catalog, ResourcesKey)
		if lerr != nil && !errors.Is(lerr, ErrNotFound) {
			err = fmt.Errorf("read: %w", lerr)
			continue
		}
		next := resources{V: envelope.Version}
		if have != nil {
			next = *have
			next.V = envelope.Version
		}
		if err := change(&next); err != nil {
			return err
		}
		switch {
		case have != nil && *have == next:
			return nil
		case have == nil:
			_, err = Create(ctx, b.Catalog, ResourcesKey, &next)
		default:
			_, err = Update(ctx, b.Catalog, ResourcesKey, &next, rev)
		}
		if err == nil {
			return nil
		}
	}
	return fmt.Errorf("capstan: bucket %s: record %s: %w", b.Names.CatalogBucket(), ResourcesKey, err)
}

// ErrRecordWindow marks a worker set to a record window other than its
// deployment's (DESIGN §16). It is an ErrConfigConflict.
var ErrRecordWindow = fmt.Errorf("%w: the record window", ErrConfigConflict)

// AgreeRecordWindow makes the deployment's record window this process's
// (Config.RecordWindow), as every worker does at start, before it writes a
// record: a deployment has one window. The first worker of a deployment
// records its own; a later one set to the same adopts it, one set to none
// (set is false: the window is the default) adopts the deployment's, and
// one set to another is refused with ErrRecordWindow, whatever it would
// otherwise do. Workers that judged "no record" by different windows could
// run a request twice (DESIGN §5, What a missing record proves).
func (b *Broker) AgreeRecordWindow(ctx context.Context, set bool) error {
	mine := b.Config.RecordWindow
	var deployed time.Duration
	err := b.changeResources(ctx, func(r *resources) error {
		if r.RecordWindowMs <= 0 {
			r.RecordWindowMs = mine.Milliseconds()
		}
		deployed = time.Duration(r.RecordWindowMs) * time.Millisecond
		if set && deployed != mine {
			return fmt.Errorf("%w: this worker is set to %v, but its deployment (prefix %s) keeps execution records %v after their last write, and every worker of a deployment must use one window: start it with the deployment's (--record-window %v), or leave it unset to adopt it",
				ErrRecordWindow, mine, b.Names.prefix, deployed, deployed)
		}
		return nil
	})
	if err != nil {
		return err
	}
	b.Config.RecordWindow = deployed
	return nil
}

// RecordWindow reads the deployment's record window, as its first worker
// recorded it (0: no worker has started yet).
func (b *Broker) RecordWindow(ctx context.Context) (time.Duration, error) {
	r, _, err := Load[resources](ctx, b.Catalog, ResourcesKey)
	switch {
	case errors.Is(err, ErrNotFound):
		return 0, nil
	case err != nil:
		return 0, err
	}
	return time.Duration(r.RecordWindowMs) * time.Millisecond, nil
}

// EnvelopeRetention reads how long the envelopes bucket keeps envelopes: as
// provisioning recorded it in the catalog, or, for resources an earlier
// version provisioned, from the bucket's stream information (which a
// producer may not read).
func (b *Broker) EnvelopeRetention(ctx context.Context) (time.Duration, error) {
	r, _, err := Load[resources](ctx, b.Catalog, ResourcesKey)
	switch {
	case err == nil && r.EnvelopeRetentionMs > 0:
		return time.Duration(r.EnvelopeRetentionMs) * time.Millisecond, nil
	case err != nil && !errors.Is(err, ErrNotFound):
		return 0, fmt.Errorf("capstan: read %s of bucket %s: %w", ResourcesKey, b.Names.CatalogBucket(), err)
	}
	st, err := b.Envelopes.Status(ctx)
	if err != nil {
		return 0, fmt.Errorf("capstan: read bucket %s: %w", b.Names.EnvelopesBucket(), err)
	}
	if st.TTL() <= 0 {
		return 0, fmt.Errorf("capstan: bucket %s keeps envelopes for ever", b.Names.EnvelopesBucket())
	}
	return st.TTL(), nil
}

// allowMsgTTL lets a bucket's writes carry their own TTL (the executions
// bucket's records, DESIGN §16). A bucket from an earlier version gets it by
// an update, which only adds a capability: nothing stored changes.
func allowMsgTTL(ctx context.Context, js jetstream.JetStream, stream string) error {
	s, err := existingStream(ctx, js, stream)
	if err != nil {
		return fmt.Errorf("capstan: read stream %s: %w", stream, err)
	}
	cfg := s.CachedInfo().Config
	if cfg.AllowMsgTTL {
		return nil
	}
	cfg.AllowMsgTTL = true
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		if errors.Is(err, nats.ErrPermissionViolation) {
			// A worker's credentials may not update streams: an admin's must
			// provision first (capstan auth push, capstan server --auth).
			return fmt.Errorf("capstan: stream %s needs an update these credentials may not make (allow per-message TTLs): "+
				"provision as an admin first, e.g. 'capstan auth push DIR': %w", stream, err)
		}
		return fmt.Errorf("capstan: stream %s: allow per-message TTLs: %w", stream, err)
	}
	return nil
}

// ensureStream creates the stream or checks the existing one, which is never
// changed. With keepMaxAge an existing stream's MaxAge is accepted whatever it
// is. Creating first matters on a cluster: a stream's info has no one to
// answer it until the stream's group has elected a leader, while a create is
// answered by the cluster's meta leader.
func ensureStream(ctx context.Context, js jetstream.JetStream, rc *replicaChoice, want jetstream.StreamConfig, keepMaxAge bool) (jetstream.Stream, error) {
	return ensureStreamAs(ctx, js, rc, want, keepMaxAge, nil)
}

// ensureStreamAs is ensureStream, with adjust (if not nil) given the
// existing stream's configuration to take what capstan accepts of it into
// want before the two are compared.
func ensureStreamAs(ctx context.Context, js jetstream.JetStream, rc *replicaChoice, want jetstream.StreamConfig, keepMaxAge bool,
	adjust func(have jetstream.StreamConfig, want *jetstream.StreamConfig)) (jetstream.Stream, error) {
	want.Replicas = rc.forNew(ctx)
	s, cerr := js.CreateStream(ctx, want)
	if cerr == nil {
		return s, nil
	}
	// It exists with another configuration, or the server refuses this one
	// (a single server refuses R3 even for a stream that exists as R1).
	s, err := readRefused(ctx, js, want.Name, "stream "+want.Name, want.Replicas, cerr)
	if err != nil {
		return nil, err
	}
	have := s.CachedInfo().Config
	want.Replicas = rc.against(have.Replicas)
	if keepMaxAge {
		want.MaxAge = have.MaxAge
	}
	if adjust != nil {
		adjust(have, &want)
	}
	if have.MaxAge == 0 && want.MaxAge > 0 && streamDiff(withMaxAge(have, want.MaxAge), want) == "" {
		// A stream from an earlier version, which kept requests for ever:
		// bounding their age only tightens it.
		have.MaxAge = want.MaxAge
		if s, err = js.UpdateStream(ctx, have); err != nil {
			return nil, fmt.Errorf("capstan: stream %s: set MaxAge: %w", want.Name, err)
		}
		have = s.CachedInfo().Config
	}
	if diff := streamDiff(have, want); diff != "" {
		return nil, fmt.Errorf("%w: stream %s: %s", ErrConfigConflict, want.Name, diff)
	}
	if (want.DenyDelete && !have.DenyDelete) || (want.DenyPurge && !have.DenyPurge) {
		// A stream from an earlier version: denying removal only tightens it,
		// and the server never lets it be undone.
		have.DenyDelete = have.DenyDelete || want.DenyDelete
		have.DenyPurge = have.DenyPurge || want.DenyPurge
		if s, err = js.UpdateStream(ctx, have); err != nil {
			return nil, fmt.Errorf("capstan: stream %s: deny delete and purge: %w", want.Name, err)
		}
	}
	if want.AllowBatchPublish && !s.CachedInfo().Config.AllowBatchPublish {
		// A stream from an earlier version: batches only add a way to write
		// it. Credentials that may not update it leave it as it is, and
		// events are acknowledged one by one.
		cfg := s.CachedInfo().Config
		cfg.AllowBatchPublish = true
		if updated, err := js.UpdateStream(ctx, cfg); err == nil {
			s = updated
		}
	}
	if want.AllowDirect && !s.CachedInfo().Config.AllowDirect {
		// A stream from an earlier version: direct gets only add a way to
		// read it. Credentials that may not update a stream leave it as it
		// is, and its readers use message gets.
		cfg := s.CachedInfo().Config
		cfg.AllowDirect = true
		if updated, err := js.UpdateStream(ctx, cfg); err == nil {
			s = updated
		}
	}
	return s, nil
}

// ensureEnvelopes creates the envelopes bucket or checks the existing one, and
// returns it with its TTL, the envelope retention. An existing bucket whose
// TTL differs keeps it with keepTTL (no retention was set), and is otherwise
// updated to want's: shrinking or growing the retention is an operator's
// choice, logged. Any other difference is a conflict, as for every bucket.
func ensureEnvelopes(ctx context.Context, js jetstream.JetStream, rc *replicaChoice, want jetstream.KeyValueConfig,
	keepTTL bool, log *slog.Logger) (jetstream.KeyValue, time.Duration, error) {
	kv, err := ensureBucket(ctx, js, rc, want)
	if err == nil {
		return kv, want.TTL, nil
	}
	if !errors.Is(err, ErrConfigConflict) {
		return nil, 0, err
	}
	s, serr := js.Stream(ctx, "KV_"+want.Bucket)
	if serr != nil {
		return nil, 0, err
	}
	have := s.CachedInfo().Config
	asIs := want
	asIs.TTL = have.MaxAge
	asIs.Replicas = rc.against(have.Replicas)
	if have.MaxAge == want.TTL {
		return nil, 0, err
	}
	if diff := bucketDiff(have, asIs); diff != "" {
		// Another field differs: the TTL is not part of the conflict.
		return nil, 0, fmt.Errorf("%w: bucket %s: %s", ErrConfigConflict, want.Bucket, diff)
	}
	if !keepTTL {
		have.MaxAge = want.TTL
		// As a new bucket's: JetStream keeps no duplicate window longer
		// than the stream's MaxAge.
		have.Duplicates = min(DefaultDedupWindow, want.TTL)
		if s, err = js.UpdateStream(ctx, have); err != nil {
			return nil, 0, fmt.Errorf("capstan: bucket %s: set TTL %v: %w", want.Bucket, want.TTL, err)
		}
		log.Info("envelope retention changed", "bucket", want.Bucket, "from", asIs.TTL, "to", want.TTL)
	}
	if kv, err = js.KeyValue(ctx, want.Bucket); err != nil {
		return nil, 0, err
	}
	return kv, s.CachedInfo().Config.MaxAge, nil
}

func withMaxAge(c jetstream.StreamConfig, d time.Duration) jetstream.StreamConfig {
	c.MaxAge = d
	return c
}

// ensureBucket creates the bucket or checks the existing one, which is never
// changed.
func ensureBucket(ctx context.Context, js jetstream.JetStream, rc *replicaChoice, want jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	want.Replicas = rc.forNew(ctx)
	kv, cerr := js.CreateKeyValue(ctx, want)
	if cerr == nil {
		return kv, nil
	}
	s, err := readRefused(ctx, js, "KV_"+want.Bucket, "bucket "+want.Bucket, want.Replicas, cerr)
	if err != nil {
		return nil, err
	}
	have := s.CachedInfo().Config
	want.Replicas = rc.against(have.Replicas)
	if diff := bucketDiff(have, want); diff != "" {
		return nil, fmt.Errorf("%w: bucket %s: %s", ErrConfigConflict, want.Bucket, diff)
	}
	return js.KeyValue(ctx, want.Bucket)
}

// readRefused reads the stream a create of what (its replicas, with the
// server's error cerr) refused: one the create said exists as
// existingStream reads it, any other as the server has it. Unread, the
// error is the read's for one that exists, else the create's.
func readRefused(ctx context.Context, js jetstream.JetStream, name, what string, replicas int, cerr error) (jetstream.Stream, error) {
	if errors.Is(cerr, jetstream.ErrStreamNameAlreadyInUse) || errors.Is(cerr, jetstream.ErrBucketExists) {
		s, err := existingStream(ctx, js, name)
		if err != nil {
			return nil, fmt.Errorf("capstan: read %s: %w", what, err)
		}
		return s, nil
	}
	s, err := js.Stream(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("capstan: create %s (replicas %d): %w", what, replicas, cerr)
	}
	return s, nil
}

// bucketDiff names every field of a bucket's stream capstan relies on that differs.
func bucketDiff(have jetstream.StreamConfig, want jetstream.KeyValueConfig) string {
	d := differs(nil, "History", have.MaxMsgsPerSubject, int64(want.History))
	d = differs(d, "TTL", have.MaxAge, want.TTL)
	d = differs(d, "Storage", have.Storage, want.Storage)
	if have.Replicas != want.Replicas {
		d = append(d, replicasDiff(have.Replicas, want.Replicas))
	}
	if !reflect.DeepEqual(have.RePublish, want.RePublish) {
		d = append(d, fmt.Sprintf("RePublish is %+v, capstan needs %+v", have.RePublish, want.RePublish))
	}
	return strings.Join(d, "; ")
}

// streamDiff names every field capstan relies on that differs.
func streamDiff(have, want jetstream.StreamConfig) string {
	var d []string
	if !slices.Equal(have.Subjects, want.Subjects) {
		d = append(d, fmt.Sprintf("Subjects are %v, capstan needs %v", have.Subjects, want.Subjects))
	}
	d = differs(d, "Retention", have.Retention, want.Retention)
	d = differs(d, "Storage", have.Storage, want.Storage)
	if have.Replicas != want.Replicas {
		d = append(d, replicasDiff(have.Replicas, want.Replicas))
	}
	if want.Duplicates != 0 {
		d = differs(d, "Duplicates", have.Duplicates, want.Duplicates)
	}
	d = differs(d, "MaxAge", have.MaxAge, want.MaxAge)
	// A cap capstan did not ask for drops requests or events without a trace.
	d = differs(d, "MaxMsgs", unlimited(have.MaxMsgs), unlimited(want.MaxMsgs))
	d = differs(d, "MaxBytes", unlimited(have.MaxBytes), unlimited(want.MaxBytes))
	d = differs(d, "MaxMsgsPerSubject", unlimited(have.MaxMsgsPerSubject), unlimited(want.MaxMsgsPerSubject))
	d = differs(d, "Discard", have.Discard, want.Discard)
	return strings.Join(d, "; ")
}

// differs adds "field is have, capstan needs want" to d when they differ.
func differs[T comparable](d []string, field string, have, want T) []string {
	if have != want {
		d = append(d, fmt.Sprintf("%s is %v, capstan needs %v", field, have, want))
	}
	return d
}

// unlimited folds the ways a stream says "no limit" (0 or any negative) into -1.
func unlimited(v int64) int64 {
	if v <= 0 {
		return -1
	}
	return v
}

// Open binds the buckets a client reads without creating or checking
// anything: clients never provision, and a producer's credentials would not
// let it. The envelopes, executions and catalog buckets are bound for reading
// by key only (direct gets; every other operation fails with ErrByKeyOnly):
// a producer may not ask for their stream information, which would list
// every principal's keys, and a principal's own account has no JetStream to
// answer it (DESIGN §12 "Accounts per principal": only direct gets cross).
// Exec, Audit, Approvals and Pools are left nil. Open fails with
// jetstream.ErrBucketNotFound while the catalog does not exist yet (no server
// or worker has provisioned; provisioning creates it after the other two),
// and with the server's refusal when the credentials do not allow reading it.
func Open(ctx context.Context, nc *nats.Conn, cfg Config) (*Broker, error) {
	cfg = cfg.withDefaults()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(AsyncAckTimeout))
	if err != nil {
		return nil, err
	}
	n := NewNames(cfg.Prefix)
	b := &Broker{NC: nc, JS: js, Names: n, Config: cfg}
	b.ReadsMayLag() // remembers the cluster the connection is in now
	b.Catalog = bindByKey(nc, n.CatalogBucket())
	// The entry provisioning writes last tells that the catalog exists: a
	// direct get of a stream that does not exist finds no responder.
	if _, err := b.Catalog.Get(ctx, ResourcesKey); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		if errors.Is(err, nats.ErrNoResponders) {
			return nil, fmt.Errorf("capstan: bucket %s does not exist: start a server, a worker or 'capstan server' first: %w: %w",
				n.CatalogBucket(), jetstream.ErrBucketNotFound, err)
		}
		return nil, fmt.Errorf("capstan: open bucket %s: %w", n.CatalogBucket(), err)
	}
	b.Envelopes, b.Executions = bindByKey(nc, n.EnvelopesBucket()), bindByKey(nc, n.ExecutionsBucket())
	return b, nil
}

func openBucket(ctx context.Context, js jetstream.JetStream, name string) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, name)
	if err != nil {
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			return nil, fmt.Errorf("capstan: bucket %s does not exist: start a server, a worker or 'capstan server' first: %w", name, err)
		}
		return nil, fmt.Errorf("capstan: open bucket %s: %w", name, err)
	}
	return kv, nil
}

// OpenAll binds every stream and bucket of the design, each whole, without
// creating or checking anything, for a connection that may read them all (an
// open server's, an admin's). It fails when one does not exist yet.
func OpenAll(ctx context.Context, nc *nats.Conn, cfg Config) (*Broker, error) {
	b, err := Open(ctx, nc, cfg)
	if err != nil {
		return nil, err
	}
	n := b.Names
	if b.Catalog, err = openBucket(ctx, b.JS, n.CatalogBucket()); err != nil {
		return nil, err
	}
	for _, st := range []struct {
		dst  *jetstream.Stream
		name string
	}{{&b.Exec, n.ExecStream()}, {&b.Audit, n.AuditStream()}} {
		if *st.dst, err = b.JS.Stream(ctx, st.name); err != nil {
			if errors.Is(err, jetstream.ErrStreamNotFound) {
				err = fmt.Errorf("%w: %w", jetstream.ErrBucketNotFound, err) // not provisioned yet, like a bucket
			}
			return nil, fmt.Errorf("capstan: open stream %s: %w", st.name, err)
		}
	}
	b.Replicas = b.Exec.CachedInfo().Config.Replicas
	// The index is younger than the rest: a store no worker of this version
	// provisioned yet has none, and lists nothing until one does.
	if b.Index, err = b.JS.Stream(ctx, n.IndexStream()); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("capstan: open stream %s: %w", n.IndexStream(), err)
	}
	for _, kv := range []struct {
		dst  *jetstream.KeyValue
		name string
	}{
		{&b.Envelopes, n.EnvelopesBucket()}, {&b.Executions, n.ExecutionsBucket()},
		{&b.Approvals, n.ApprovalsBucket()}, {&b.Pools, n.PoolsBucket()},
	} {
		if *kv.dst, err = openBucket(ctx, b.JS, kv.name); err != nil {
			return nil, err
		}
	}
	// The limits bucket is younger than the rest: a store no worker of this
	// version provisioned yet has none, and no limit has been taken there.
	if b.Limits, err = b.JS.KeyValue(ctx, n.LimitsBucket()); err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, fmt.Errorf("capstan: open bucket %s: %w", n.LimitsBucket(), err)
	}
	// So are the trail's tree and checkpoints.
	if b.Trail, err = b.JS.KeyValue(ctx, n.TrailBucket()); err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, fmt.Errorf("capstan: open bucket %s: %w", n.TrailBucket(), err)
	}
	if b.Checkpoints, err = b.JS.Stream(ctx, n.CheckpointStream()); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("capstan: open stream %s: %w", n.CheckpointStream(), err)
	}
	return b, nil
}
