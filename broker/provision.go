package broker

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrConfigConflict marks an existing resource whose configuration differs from
// what capstan needs. Provisioning never overwrites it.
var ErrConfigConflict = errors.New("capstan: existing resource conflicts")

// Defaults of Config.
const (
	DefaultRecordTTL   = 7 * 24 * time.Hour
	DefaultAuditMaxAge = 30 * 24 * time.Hour
	DefaultDedupWindow = 2 * time.Minute
)

// Config says how to provision. Zero values are the defaults.
type Config struct {
	// Prefix of every name (default "CAPSTAN"; subjects use it in lower case).
	Prefix string
	// Replicas of every stream and bucket (default 1).
	Replicas int
	// RecordTTL keeps execution records, envelopes and approvals (default 7 days).
	RecordTTL time.Duration
	// AuditMaxAge is the audit stream's retention. Unset, a new stream keeps
	// events 30 days and an existing one keeps the retention it was given, so
	// that only the process that sets it needs to know it.
	AuditMaxAge time.Duration
	// AuditMaxBytes caps the audit stream (0: unlimited). With AuditDiscardNew a
	// full stream refuses new events instead of dropping old ones.
	AuditMaxBytes   int64
	AuditDiscardNew bool
	// DedupWindow is the exec stream's duplicate window (default and minimum 2 min).
	DedupWindow time.Duration
}

func (c Config) withDefaults() Config {
	if c.Replicas <= 0 {
		c.Replicas = 1
	}
	if c.RecordTTL <= 0 {
		c.RecordTTL = DefaultRecordTTL
	}
	if c.AuditMaxAge <= 0 {
		c.AuditMaxAge = DefaultAuditMaxAge
	}
	if c.DedupWindow < DefaultDedupWindow {
		c.DedupWindow = DefaultDedupWindow
	}
	return c
}

// Broker holds the provisioned resources.
type Broker struct {
	NC     *nats.Conn
	JS     jetstream.JetStream
	Names  Names
	Config Config

	Exec       jetstream.Stream
	Audit      jetstream.Stream
	Executions jetstream.KeyValue
	Envelopes  jetstream.KeyValue
	Approvals  jetstream.KeyValue
	Catalog    jetstream.KeyValue
	// Pools records what the workers of each pool asked of its consumer, so
	// that concurrent widenings never lose a capability (see EnsurePool).
	Pools jetstream.KeyValue
}

// Provision creates every stream and bucket of the design, or checks that the
// existing ones match. It is idempotent and safe to call from every process at
// start. A conflicting existing resource fails with ErrConfigConflict and a
// message naming the resource and the field.
func Provision(ctx context.Context, nc *nats.Conn, cfg Config) (*Broker, error) {
	keepAuditMaxAge := cfg.AuditMaxAge <= 0
	cfg = cfg.withDefaults()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	n := NewNames(cfg.Prefix)
	b := &Broker{NC: nc, JS: js, Names: n, Config: cfg}

	b.Exec, err = ensureStream(ctx, js, jetstream.StreamConfig{
		Name:       n.ExecStream(),
		Subjects:   []string{n.ExecSubjects()},
		Retention:  jetstream.WorkQueuePolicy,
		Storage:    jetstream.FileStorage,
		Replicas:   cfg.Replicas,
		Duplicates: cfg.DedupWindow,
		Discard:    jetstream.DiscardOld,
	}, false)
	if err != nil {
		return nil, err
	}
	discard := jetstream.DiscardOld
	if cfg.AuditDiscardNew {
		discard = jetstream.DiscardNew
	}
	auditMaxBytes := cfg.AuditMaxBytes
	if auditMaxBytes == 0 {
		auditMaxBytes = -1
	}
	b.Audit, err = ensureStream(ctx, js, jetstream.StreamConfig{
		Name:      n.AuditStream(),
		Subjects:  []string{n.AuditSubjects()},
		Retention: jetstream.LimitsPolicy,
		Storage:   jetstream.FileStorage,
		Replicas:  cfg.Replicas,
		MaxAge:    cfg.AuditMaxAge,
		MaxBytes:  auditMaxBytes,
		Discard:   discard,
	}, keepAuditMaxAge)
	if err != nil {
		return nil, err
	}
	b.Config.AuditMaxAge = b.Audit.CachedInfo().Config.MaxAge
	// Envelopes are republished once stored: a client's one subscription sees
	// only envelopes JetStream accepted, never a refused second finalization.
	envelopesRepublish := &jetstream.RePublish{
		Source:      "$KV." + n.EnvelopesBucket() + ".>",
		Destination: n.EnvelopeSubjects(),
	}
	for _, kv := range []struct {
		dst       *jetstream.KeyValue
		name      string
		ttl       time.Duration
		republish *jetstream.RePublish
	}{
		{&b.Executions, n.ExecutionsBucket(), cfg.RecordTTL, nil},
		{&b.Envelopes, n.EnvelopesBucket(), cfg.RecordTTL, envelopesRepublish},
		{&b.Approvals, n.ApprovalsBucket(), cfg.RecordTTL, nil},
		{&b.Catalog, n.CatalogBucket(), 0, nil},
		{&b.Pools, n.PoolsBucket(), 0, nil},
	} {
		*kv.dst, err = ensureBucket(ctx, js, jetstream.KeyValueConfig{
			Bucket:    kv.name,
			History:   1,
			TTL:       kv.ttl,
			Storage:   jetstream.FileStorage,
			Replicas:  cfg.Replicas,
			RePublish: kv.republish,
		})
		if err != nil {
			return nil, err
		}
	}
	return b, nil
}

// ensureStream creates the stream or checks the existing one. With keepMaxAge
// an existing stream's MaxAge is accepted whatever it is.
func ensureStream(ctx context.Context, js jetstream.JetStream, want jetstream.StreamConfig, keepMaxAge bool) (jetstream.Stream, error) {
	s, err := js.CreateStream(ctx, want)
	if err == nil {
		return s, nil
	}
	if !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return nil, fmt.Errorf("capstan: create stream %s: %w", want.Name, err)
	}
	s, err = js.Stream(ctx, want.Name)
	if err != nil {
		return nil, fmt.Errorf("capstan: read stream %s: %w", want.Name, err)
	}
	if keepMaxAge {
		want.MaxAge = s.CachedInfo().Config.MaxAge
	}
	if diff := streamDiff(s.CachedInfo().Config, want); diff != "" {
		return nil, fmt.Errorf("%w: stream %s: %s", ErrConfigConflict, want.Name, diff)
	}
	return s, nil
}

func ensureBucket(ctx context.Context, js jetstream.JetStream, want jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	kv, err := js.CreateKeyValue(ctx, want)
	if err == nil {
		return kv, nil
	}
	if !errors.Is(err, jetstream.ErrBucketExists) && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return nil, fmt.Errorf("capstan: create bucket %s: %w", want.Bucket, err)
	}
	s, err := js.Stream(ctx, "KV_"+want.Bucket)
	if err != nil {
		return nil, fmt.Errorf("capstan: read bucket %s: %w", want.Bucket, err)
	}
	have := s.CachedInfo().Config
	var diffs []string
	if have.MaxMsgsPerSubject != int64(want.History) {
		diffs = append(diffs, fmt.Sprintf("History is %d, capstan needs %d", have.MaxMsgsPerSubject, want.History))
	}
	if have.MaxAge != want.TTL {
		diffs = append(diffs, fmt.Sprintf("TTL is %v, capstan needs %v", have.MaxAge, want.TTL))
	}
	if have.Storage != want.Storage {
		diffs = append(diffs, fmt.Sprintf("Storage is %v, capstan needs %v", have.Storage, want.Storage))
	}
	if have.Replicas != want.Replicas {
		diffs = append(diffs, fmt.Sprintf("Replicas is %d, capstan needs %d", have.Replicas, want.Replicas))
	}
	if !reflect.DeepEqual(have.RePublish, want.RePublish) {
		diffs = append(diffs, fmt.Sprintf("RePublish is %+v, capstan needs %+v", have.RePublish, want.RePublish))
	}
	if len(diffs) > 0 {
		return nil, fmt.Errorf("%w: bucket %s: %s", ErrConfigConflict, want.Bucket, strings.Join(diffs, "; "))
	}
	return js.KeyValue(ctx, want.Bucket)
}

// streamDiff names every field capstan relies on that differs.
func streamDiff(have, want jetstream.StreamConfig) string {
	var d []string
	if !slices.Equal(have.Subjects, want.Subjects) {
		d = append(d, fmt.Sprintf("Subjects are %v, capstan needs %v", have.Subjects, want.Subjects))
	}
	if have.Retention != want.Retention {
		d = append(d, fmt.Sprintf("Retention is %v, capstan needs %v", have.Retention, want.Retention))
	}
	if have.Storage != want.Storage {
		d = append(d, fmt.Sprintf("Storage is %v, capstan needs %v", have.Storage, want.Storage))
	}
	if have.Replicas != want.Replicas {
		d = append(d, fmt.Sprintf("Replicas is %d, capstan needs %d", have.Replicas, want.Replicas))
	}
	if want.Duplicates != 0 && have.Duplicates != want.Duplicates {
		d = append(d, fmt.Sprintf("Duplicates is %v, capstan needs %v", have.Duplicates, want.Duplicates))
	}
	if have.MaxAge != want.MaxAge {
		d = append(d, fmt.Sprintf("MaxAge is %v, capstan needs %v", have.MaxAge, want.MaxAge))
	}
	// A cap capstan did not ask for drops requests or events without a trace.
	for _, limit := range []struct {
		field      string
		have, want int64
	}{
		{"MaxMsgs", have.MaxMsgs, want.MaxMsgs},
		{"MaxBytes", have.MaxBytes, want.MaxBytes},
		{"MaxMsgsPerSubject", have.MaxMsgsPerSubject, want.MaxMsgsPerSubject},
	} {
		if h, w := unlimited(limit.have), unlimited(limit.want); h != w {
			d = append(d, fmt.Sprintf("%s is %d, capstan needs %d", limit.field, h, w))
		}
	}
	if have.Discard != want.Discard {
		d = append(d, fmt.Sprintf("Discard is %v, capstan needs %v", have.Discard, want.Discard))
	}
	return strings.Join(d, "; ")
}

// unlimited folds the ways a stream says "no limit" (0 or any negative) into -1.
func unlimited(v int64) int64 {
	if v <= 0 {
		return -1
	}
	return v
}
