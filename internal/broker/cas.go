package broker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/jsget"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Sentinel conditions of the key-value helpers. Compare with errors.Is.
var (
	// ErrNotFound: the key has no value.
	ErrNotFound = errors.New("capstan: not found")
	// ErrExists: a create-only write found the key already written.
	ErrExists = errors.New("capstan: already exists")
	// ErrRevisionMismatch: a compare-and-swap lost; re-read and decide again.
	ErrRevisionMismatch = errors.New("capstan: revision mismatch")
)

// Backoff is the pause before trying again an operation JetStream did not
// answer, or refused while a stream or bucket elects a leader: 10 ms longer
// at each try, at most 500 ms.
func Backoff(try int) time.Duration {
	d := time.Duration(10*(try+1)) * time.Millisecond
	if d > 500*time.Millisecond {
		d = 500 * time.Millisecond
	}
	return d
}

// Load reads and decodes one record, returning its revision for a later CAS.
func Load[T any](ctx context.Context, kv jetstream.KeyValue, key string) (*T, uint64, error) {
	e, err := kv.Get(ctx, key)
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
			return nil, 0, ErrNotFound
		}
		return nil, 0, err
	}
	return decodeValue[T](kv, key, e.Value(), e.Revision())
}

// decodeValue is key's value data, stored at revision rev.
func decodeValue[T any](kv jetstream.KeyValue, key string, data []byte, rev uint64) (*T, uint64, error) {
	v := new(T)
	if err := envelope.Unmarshal(data, v); err != nil {
		return nil, 0, fmt.Errorf("capstan: %s/%s: %w", kv.Bucket(), key, err)
	}
	return v, rev, nil
}

// Create writes v under key only if the key holds nothing; ErrExists otherwise.
// A key whose last value was deleted holds nothing.
func Create(ctx context.Context, kv jetstream.KeyValue, key string, v any) (uint64, error) {
	return CreateTTL(ctx, kv, key, v, 0)
}

// CreateTTL is Create of a value that the bucket removes ttl after this
// write, unless a later write replaces it (the bucket must allow per-message
// TTLs); 0: no TTL.
func CreateTTL(ctx context.Context, kv jetstream.KeyValue, key string, v any, ttl time.Duration) (uint64, error) {
	b, err := envelope.Marshal(v)
	if err != nil {
		return 0, err
	}
	return CreateDataTTL(ctx, kv, key, b, ttl)
}

// CreateDataTTL is CreateTTL of a value already encoded (envelope.Marshal),
// for a caller that keeps the bytes it wrote.
func CreateDataTTL(ctx context.Context, kv jetstream.KeyValue, key string, data []byte, ttl time.Duration) (uint64, error) {
	rev, err := kv.Create(ctx, key, data, createOpts(ttl)...)
	return rev, createErr(err)
}

func createOpts(ttl time.Duration) []jetstream.KVCreateOpt {
	if ttl <= 0 {
		return nil
	}
	return []jetstream.KVCreateOpt{jetstream.KeyTTL(ttl)}
}

// createErr is ErrExists for a create that found the key written. Over a
// delete marker a create takes two writes; when a rival's create lands
// between them, a replicated bucket reports a bare wrong-last-sequence error
// instead of ErrKeyExists. (Re-reading to tell it from a rival's delete would
// not help: a replica may answer a read with an older value.)
func createErr(err error) error {
	if err != nil && (errors.Is(err, jetstream.ErrKeyExists) || WrongLastSequence(err)) {
		return ErrExists
	}
	return err
}

// UpdateTTL is Update of a value that the bucket removes ttl after this
// write, unless a later write replaces it (the bucket must allow per-message
// TTLs).
func UpdateTTL(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue, key string, v any, rev uint64, ttl time.Duration) (uint64, error) {
	b, err := envelope.Marshal(v)
	if err != nil {
		return 0, err
	}
	return UpdateDataTTL(ctx, js, kv, key, b, rev, ttl)
}

// UpdateDataTTL is UpdateTTL of a value already encoded (envelope.Marshal),
// for a caller that keeps the bytes it wrote.
func UpdateDataTTL(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue, key string, data []byte, rev uint64, ttl time.Duration) (uint64, error) {
	m := &nats.Msg{Subject: "$KV." + kv.Bucket() + "." + key, Data: data, Header: nats.Header{}}
	ack, err := js.PublishMsg(ctx, m, jetstream.WithExpectLastSequencePerSubject(rev), jetstream.WithMsgTTL(ttl))
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) || WrongLastSequence(err) {
			return 0, ErrRevisionMismatch
		}
		return 0, err
	}
	return ack.Sequence, nil
}

// Update writes v under key only if the key is still at revision rev;
// ErrRevisionMismatch otherwise. Any other error may hide a write that
// happened: re-read before deciding.
func Update(ctx context.Context, kv jetstream.KeyValue, key string, v any, rev uint64) (uint64, error) {
	b, err := envelope.Marshal(v)
	if err != nil {
		return 0, err
	}
	n, err := kv.Update(ctx, key, b, rev)
	if err != nil && (errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) || WrongLastSequence(err)) {
		return 0, ErrRevisionMismatch
	}
	return n, err
}

// WrongLastSequence reports the server's refusal of a compare-and-swap or a
// create-only publish: code 10071 from a single server, 10164 from a
// replicated stream.
func WrongLastSequence(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) &&
		(apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
			apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// LoadFromLeader reads like Load, but asks the stream's leader rather than
// any replica. Load may be answered by a replica still catching up after a
// restart, which reports a key that exists as absent; where absent and present
// lead to different decisions, confirm an absence here.
func LoadFromLeader[T any](ctx context.Context, nc *nats.Conn, kv jetstream.KeyValue, key string) (*T, uint64, error) {
	seq, deleted, data, err := lastFromLeader(ctx, nc, kv.Bucket(), key)
	return decodeLast[T](kv, key, seq, deleted, data, err)
}

// decodeLast is the value of a leader's answer (lastFromLeader).
func decodeLast[T any](kv jetstream.KeyValue, key string, seq uint64, deleted bool, data []byte, err error) (*T, uint64, error) {
	if err != nil {
		return nil, 0, err
	}
	if deleted {
		return nil, 0, ErrNotFound
	}
	return decodeValue[T](kv, key, data, seq)
}

// lastFromLeader reads key's last message from its bucket's stream leader:
// its sequence, whether it is a delete or purge marker, and its data.
// ErrNotFound when the key has no message.
func lastFromLeader(ctx context.Context, nc *nats.Conn, bucket, key string) (uint64, bool, []byte, error) {
	m, err := LastFromLeader(ctx, nc, "KV_"+bucket, "$KV."+bucket+"."+key)
	if err != nil {
		return 0, false, nil, err
	}
	op := m.Header.Get(kvOperationHeader)
	return m.Sequence, op == "DEL" || op == "PURGE", m.Data, nil
}

// LastFromLeader reads the last message of subject in stream from the
// stream's leader (a message get, never a direct get, which any replica may
// answer, one still catching up among them): where absent must mean absent.
// ErrNotFound when the stream holds no message of subject; a missing stream
// is no proof, and an error.
func LastFromLeader(ctx context.Context, nc *nats.Conn, stream, subject string) (*jetstream.RawStreamMsg, error) {
	m, err := jsget.Get(ctx, nc, stream, jsget.Request{LastFor: subject})
	if errors.Is(err, jsget.ErrNoMessage) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("capstan: %s %s: %w", stream, subject, err)
	}
	return m, nil
}

// leaderReadsWithin bounds the reads from the leader of a context without a
// deadline: an election takes a few seconds.
const leaderReadsWithin = 10 * time.Second

// ReadsMayLag reports whether a direct get of b's buckets may be answered
// by a replica behind its stream's leader: they are replicated, or, for a
// broker of Open's, which knows no replica count, its connection has been
// connected to a server of a cluster (a single server holds one replica of
// each). Once seen, a cluster stays one: a connection that is reconnecting,
// after its server was lost, names none at that moment.
func (b *Broker) ReadsMayLag() bool {
	if b.Replicas > 0 {
		return b.Replicas > 1
	}
	if b.NC.ConnectedClusterName() != "" {
		b.clustered.Store(true)
	}
	return b.clustered.Load()
}

// LoadCurrent reads like Load, where "not found" is a verdict. A direct
// get, which Load sends, is answered by any replica of a replicated bucket,
// and one that has not applied the last writes yet (after a restart or a
// failover, or merely behind) calls a key that exists absent. So an absence
// read from a bucket of b.Replicas > 1 is asked again of the stream's
// leader, through an election if one is under way; a value found costs
// nothing more, nor does anything on one replica. A broker of Open's knows
// no replica count (b.Replicas is 0) and asks no leader: a principal's
// connection sends only direct gets (DESIGN §12); where ReadsMayLag, its
// callers confirm an absence with the workers.
func LoadCurrent[T any](ctx context.Context, b *Broker, kv jetstream.KeyValue, key string) (*T, uint64, error) {
	data, rev, err := GetCurrent(ctx, b, kv, key)
	if err != nil {
		return nil, 0, err
	}
	return decodeValue[T](kv, key, data, rev)
}

// GetCurrent is LoadCurrent's read, its value undecoded, and its revision.
func GetCurrent(ctx context.Context, b *Broker, kv jetstream.KeyValue, key string) ([]byte, uint64, error) {
	return getCurrent(ctx, b.NC, b.Replicas > 1, kv, key)
}

// GetConfirmed is GetCurrent where the replica count is not known: every
// absence a direct get answers is asked again of the stream's leader, on nc.
func GetConfirmed(ctx context.Context, nc *nats.Conn, kv jetstream.KeyValue, key string) ([]byte, uint64, error) {
	return getCurrent(ctx, nc, true, kv, key)
}

func getCurrent(ctx context.Context, nc *nats.Conn, replicated bool, kv jetstream.KeyValue, key string) ([]byte, uint64, error) {
	e, err := kv.Get(ctx, key)
	switch {
	case err == nil:
		return e.Value(), e.Revision(), nil
	case !errors.Is(err, jetstream.ErrKeyNotFound) && !errors.Is(err, jetstream.ErrKeyDeleted):
		return nil, 0, err
	case !replicated:
		return nil, 0, ErrNotFound
	}
	seq, deleted, data, err := leaderLast(ctx, nc, kv.Bucket(), key)
	switch {
	case err != nil:
		return nil, 0, err
	case deleted:
		return nil, 0, ErrNotFound
	}
	return data, seq, nil
}

// Present reports whether key holds a value, as GetCurrent finds it.
func Present(ctx context.Context, b *Broker, kv jetstream.KeyValue, key string) (bool, error) {
	_, _, err := GetCurrent(ctx, b, kv, key)
	if errors.Is(err, ErrNotFound) {
		return false, nil
	}
	return err == nil, err
}

// leaderLast is lastFromLeader asked again while the stream elects its
// leader (JetStream answers that the cluster is not available) or none
// answers in time, within ctx, or leaderReadsWithin when it has no deadline.
func leaderLast(ctx context.Context, nc *nats.Conn, bucket, key string) (uint64, bool, []byte, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, leaderReadsWithin)
		defer cancel()
	}
	for try := 0; ; try++ {
		tctx, cancel := context.WithTimeout(ctx, directGetTimeout/2)
		seq, deleted, data, err := lastFromLeader(tctx, nc, bucket, key)
		cancel()
		if err == nil || errors.Is(err, ErrNotFound) {
			return seq, deleted, data, err
		}
		select {
		case <-ctx.Done():
			return 0, false, nil, fmt.Errorf("capstan: %s/%s: found on no replica, and the leader did not answer: %w", bucket, key, err)
		case <-time.After(Backoff(try)):
		}
	}
}
