package broker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/capstan-dev/capstan/internal/jsget"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrByKeyOnly is returned by every operation but Get and Bucket of a bucket
// that Open bound for reading by key.
var ErrByKeyOnly = errors.New("capstan: this bucket is bound for reading by key only")

// byKey reads a key-value bucket by key, through JetStream direct gets,
// without binding it as jetstream.KeyValue does: that asks for the bucket's
// stream information, which a producer may not ask for, since with a
// subjects filter the answer lists every key of the bucket (every
// principal's execution ids). Every other operation fails with ErrByKeyOnly.
type byKey struct {
	nc     *nats.Conn
	bucket string
}

// bindByKey returns bucket, readable by key only.
func bindByKey(nc *nats.Conn, bucket string) jetstream.KeyValue {
	return &byKey{nc: nc, bucket: bucket}
}

// kvOperationHeader is where a key-value delete or purge marker says so.
const kvOperationHeader = "KV-Operation"

// directGetTimeout bounds a read whose context has no deadline, as
// jetstream's own requests are bounded.
const directGetTimeout = 5 * time.Second

func (b *byKey) Bucket() string { return b.bucket }

// Get reads the key's last value: jetstream.ErrKeyNotFound when there is
// none, jetstream.ErrKeyDeleted (with the entry) when it was deleted or
// purged.
func (b *byKey) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	if key == "" {
		return nil, jetstream.ErrInvalidKey
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, directGetTimeout)
		defer cancel()
	}
	answer, err := b.nc.RequestWithContext(ctx, jsget.DirectSubject("KV_"+b.bucket, "$KV."+b.bucket+"."+key), nil)
	if err != nil {
		return nil, err
	}
	m, err := jsget.Direct(answer)
	if errors.Is(err, jsget.ErrNoMessage) {
		return nil, jetstream.ErrKeyNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("capstan: %s/%s: %w", b.bucket, key, err)
	}
	e := &entry{bucket: b.bucket, key: key, value: m.Data, revision: m.Sequence, created: m.Time, op: jetstream.KeyValuePut}
	switch m.Header.Get(kvOperationHeader) {
	case "DEL":
		e.op = jetstream.KeyValueDelete
	case "PURGE":
		e.op = jetstream.KeyValuePurge
	case "":
		switch m.Header.Get(jetstream.MarkerReasonHeader) {
		case "MaxAge", "Purge":
			e.op = jetstream.KeyValuePurge
		case "Remove":
			e.op = jetstream.KeyValueDelete
		}
	}
	if e.op != jetstream.KeyValuePut {
		return e, jetstream.ErrKeyDeleted
	}
	return e, nil
}

func (b *byKey) GetRevision(context.Context, string, uint64) (jetstream.KeyValueEntry, error) {
	return nil, ErrByKeyOnly
}
func (b *byKey) Put(context.Context, string, []byte) (uint64, error) { return 0, ErrByKeyOnly }
func (b *byKey) PutString(context.Context, string, string) (uint64, error) {
	return 0, ErrByKeyOnly
}
func (b *byKey) Create(context.Context, string, []byte, ...jetstream.KVCreateOpt) (uint64, error) {
	return 0, ErrByKeyOnly
}
func (b *byKey) Update(context.Context, string, []byte, uint64) (uint64, error) {
	return 0, ErrByKeyOnly
}
func (b *byKey) Delete(context.Context, string, ...jetstream.KVDeleteOpt) error { return ErrByKeyOnly }
func (b *byKey) Purge(context.Context, string, ...jetstream.KVDeleteOpt) error  { return ErrByKeyOnly }
func (b *byKey) Watch(context.Context, string, ...jetstream.WatchOpt) (jetstream.KeyWatcher, error) {
	return nil, ErrByKeyOnly
}
func (b *byKey) WatchAll(context.Context, ...jetstream.WatchOpt) (jetstream.KeyWatcher, error) {
	return nil, ErrByKeyOnly
}
func (b *byKey) WatchFiltered(context.Context, []string, ...jetstream.WatchOpt) (jetstream.KeyWatcher, error) {
	return nil, ErrByKeyOnly
}
func (b *byKey) Keys(context.Context, ...jetstream.WatchOpt) ([]string, error) {
	return nil, ErrByKeyOnly
}
func (b *byKey) ListKeys(context.Context, ...jetstream.WatchOpt) (jetstream.KeyLister, error) {
	return nil, ErrByKeyOnly
}
func (b *byKey) ListKeysFiltered(context.Context, ...string) (jetstream.KeyLister, error) {
	return nil, ErrByKeyOnly
}
func (b *byKey) History(context.Context, string, ...jetstream.WatchOpt) ([]jetstream.KeyValueEntry, error) {
	return nil, ErrByKeyOnly
}
func (b *byKey) PurgeDeletes(context.Context, ...jetstream.KVPurgeOpt) error { return ErrByKeyOnly }
func (b *byKey) Status(context.Context) (jetstream.KeyValueStatus, error) {
	return nil, ErrByKeyOnly
}

// entry is one value read by key.
type entry struct {
	bucket, key string
	value       []byte
	revision    uint64
	created     time.Time
	op          jetstream.KeyValueOp
}

func (e *entry) Bucket() string                  { return e.bucket }
func (e *entry) Key() string                     { return e.key }
func (e *entry) Value() []byte                   { return e.value }
func (e *entry) Revision() uint64                { return e.revision }
func (e *entry) Created() time.Time              { return e.created }
func (e *entry) Delta() uint64                   { return 0 }
func (e *entry) Operation() jetstream.KeyValueOp { return e.op }
