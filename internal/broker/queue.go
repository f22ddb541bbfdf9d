package broker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/envelope"
)

// Queues (DESIGN §3). Every principal that submits has a queue of its own: a
// work-queue stream of its requests alone (QueueStream), bounded by its
// quotas, which the server enforces at publication. The shared exec stream
// (ExecStream) holds the anonymous principal's requests, every principal's on
// a deployment that has no queues per principal (an open server), and the
// requests stored before a deployment got them. Workers pull from every
// queue, taking turns between them, so that one principal's backlog delays
// that principal alone.

// Queue is one exec stream of the deployment, as workers pull it.
type Queue struct {
	// Stream is the stream.
	Stream jetstream.Stream
	// Name is the stream's name.
	Name string
	// Principal is the principal whose queue it is; "" for the shared exec
	// stream, whose consumers take every principal's requests it holds.
	Principal string
}

// Queues lists the deployment's queues: the shared exec stream first, then
// every principal's, by name. A stream whose name or subjects are not a
// queue's is left out.
func (b *Broker) Queues(ctx context.Context) ([]Queue, error) {
	names, err := b.QueueNames(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]Queue, 0, len(names))
	for _, name := range names {
		s, err := b.JS.Stream(ctx, name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			continue // deleted meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("capstan: read queue %s: %w", name, err)
		}
		if q, ok := b.queueOf(s); ok {
			out = append(out, q)
		}
	}
	return out, nil
}

// QueueNames lists the names of the deployment's queues (see Queues) without
// reading each: the shared exec stream first, then the principals', sorted.
func (b *Broker) QueueNames(ctx context.Context) ([]string, error) {
	l := b.JS.StreamNames(ctx, jetstream.WithStreamListSubject(b.Names.ExecSubjects()))
	var names []string
	for name := range l.Name() {
		if name == b.Names.ExecStream() || b.Names.PrincipalOfQueue(name) != "" {
			names = append(names, name)
		}
	}
	if err := l.Err(); err != nil {
		return nil, fmt.Errorf("capstan: list queues: %w", err)
	}
	slices.SortFunc(names, func(x, y string) int {
		switch {
		case x == b.Names.ExecStream():
			return -1
		case y == b.Names.ExecStream():
			return 1
		}
		return strings.Compare(x, y)
	})
	return names, nil
}

// QueueNamed reads the queue whose stream is named name; ok is false when
// it is no queue of the deployment's (or no longer exists).
func (b *Broker) QueueNamed(ctx context.Context, name string) (q Queue, ok bool, err error) {
	s, err := b.JS.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return Queue{}, false, nil
	}
	if err != nil {
		return Queue{}, false, fmt.Errorf("capstan: read queue %s: %w", name, err)
	}
	q, ok = b.queueOf(s)
	return q, ok, nil
}

// queueOf reports whether s is one of the deployment's queues, and which.
func (b *Broker) queueOf(s jetstream.Stream) (Queue, bool) {
	cfg := s.CachedInfo().Config
	if cfg.Name == b.Names.ExecStream() {
		return Queue{Stream: s, Name: cfg.Name}, true
	}
	p := b.Names.PrincipalOfQueue(cfg.Name)
	if p == "" || !slices.Equal(cfg.Subjects, []string{b.Names.QueueSubjects(p)}) || cfg.Retention != jetstream.WorkQueuePolicy {
		return Queue{}, false
	}
	return Queue{Stream: s, Name: cfg.Name, Principal: p}, true
}

// SharedQueue is the shared exec stream as a Queue.
func (b *Broker) SharedQueue() Queue {
	return Queue{Stream: b.Exec, Name: b.Names.ExecStream()}
}

// ensureExec creates the shared exec stream, or checks the existing one. A
// stream narrowed to the anonymous principal's subjects (ProvisionQueues did,
// when the deployment got queues per principal) is kept so. Its bound
// (Config.QueueMaxBytes) is set on a new stream; an existing one keeps its
// own unless one is given, and is then changed to it, refusing new requests
// once full rather than dropping stored ones.
func ensureExec(ctx context.Context, js jetstream.JetStream, rc *replicaChoice, n Names, cfg Config) (jetstream.Stream, error) {
	bound := cfg.QueueMaxBytes
	if bound == 0 {
		bound = DefaultQueueMaxBytes
	}
	want := jetstream.StreamConfig{
		Name:       n.ExecStream(),
		Subjects:   []string{n.ExecSubjects()},
		Retention:  jetstream.WorkQueuePolicy,
		Storage:    jetstream.FileStorage,
		Duplicates: cfg.DedupWindow,
		// A full queue refuses the request at its publication: the
		// producer learns it at once, and nothing stored is dropped.
		Discard:  jetstream.DiscardNew,
		MaxBytes: bound,
		// A request older than the record TTL could find its execution's
		// record expired and run again from scratch: JetStream drops it
		// first, and the sweeper ends it before (DESIGN §13).
		MaxAge: cfg.RecordTTL,
	}
	var change bool
	s, err := ensureStreamAs(ctx, js, rc, want, false, func(have jetstream.StreamConfig, want *jetstream.StreamConfig) {
		if slices.Equal(have.Subjects, []string{n.QueueSubjects(Anonymous)}) {
			want.Subjects = have.Subjects
		}
		// Limits that refuse new requests are an operator's; so is no
		// limit at all (a stream of an earlier version). Limits that drop
		// stored requests are a conflict.
		unbounded := unlimited(have.MaxMsgs) < 0 && unlimited(have.MaxBytes) < 0
		if have.Discard != jetstream.DiscardNew && !unbounded {
			return
		}
		change = cfg.QueueMaxBytes != 0 && (unlimited(have.MaxBytes) != unlimited(want.MaxBytes) || have.Discard != jetstream.DiscardNew)
		// Until changed below, the limits it has are kept.
		want.MaxMsgs, want.MaxBytes, want.Discard = have.MaxMsgs, have.MaxBytes, have.Discard
	})
	if err != nil || !change {
		return s, err
	}
	have := s.CachedInfo().Config
	have.MaxBytes, have.Discard = bound, jetstream.DiscardNew
	if s, err = js.UpdateStream(ctx, have); err != nil {
		return nil, fmt.Errorf("capstan: stream %s: bound its bytes to %d: %w", n.ExecStream(), bound, err)
	}
	return s, nil
}

// QueueLimits bound one principal's queue: how many requests and bytes it
// holds at once; -1 is no bound of its own (the deployment's bytes bound
// it still).
type QueueLimits struct {
	// Requests is how many requests the queue holds at most.
	Requests int64
	// Bytes is how many bytes its requests hold at most.
	Bytes int64
}

// ProvisionQueues gives each principal of want its queue, bounded by its
// limits and by the shared exec stream's bytes, and changes the limits of
// an existing one to them. The first time, it narrows the shared exec
// stream to the anonymous principal's subjects (the requests it holds stay
// and are served). The queues take the shared stream's retention,
// duplicate window and replicas. The queue of a principal no longer in want
// is deleted once empty (its requests end first). Nothing is done before the
// shared exec stream is provisioned. It needs an admin's rights: workers may
// not create or update streams.
func ProvisionQueues(ctx context.Context, js jetstream.JetStream, n Names, want map[string]QueueLimits) error {
	js = resending{js}
	shared, err := js.Stream(ctx, n.ExecStream())
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("capstan: read stream %s: %w", n.ExecStream(), err)
	}
	tmpl := shared.CachedInfo().Config
	if len(want) > 0 && slices.Equal(tmpl.Subjects, []string{n.ExecSubjects()}) {
		tmpl.Subjects = []string{n.QueueSubjects(Anonymous)}
		if _, err := js.UpdateStream(ctx, tmpl); err != nil {
			return fmt.Errorf("capstan: stream %s: keep the anonymous principal's requests only: %w", n.ExecStream(), err)
		}
	}
	principals := make([]string, 0, len(want))
	for p := range want {
		principals = append(principals, p)
	}
	slices.Sort(principals)
	for _, p := range principals {
		if p == Anonymous || !ValidPrincipal(p) {
			return fmt.Errorf("capstan: no queue for principal %q", p)
		}
		if err := ensureQueue(ctx, js, n, p, queueConfig(n, p, tmpl, want[p])); err != nil {
			return err
		}
	}
	return retireQueues(ctx, js, n, want)
}

// queueConfig is principal's queue, bounded by l, as the shared stream tmpl
// says a queue is kept.
func queueConfig(n Names, principal string, tmpl jetstream.StreamConfig, l QueueLimits) jetstream.StreamConfig {
	maxBytes := unlimited(tmpl.MaxBytes)
	if b := unlimited(l.Bytes); b > 0 && (maxBytes < 0 || b < maxBytes) {
		maxBytes = b
	}
	return jetstream.StreamConfig{
		Name:       n.QueueStream(principal),
		Subjects:   []string{n.QueueSubjects(principal)},
		Retention:  jetstream.WorkQueuePolicy,
		Storage:    tmpl.Storage,
		Replicas:   tmpl.Replicas,
		Duplicates: tmpl.Duplicates,
		MaxAge:     tmpl.MaxAge,
		Discard:    jetstream.DiscardNew,
		MaxMsgs:    unlimited(l.Requests),
		MaxBytes:   maxBytes,
	}
}

// ensureQueue creates a principal's queue, or brings the limits and
// retention of the existing one to want's.
func ensureQueue(ctx context.Context, js jetstream.JetStream, n Names, principal string, want jetstream.StreamConfig) error {
	_, cerr := js.CreateStream(ctx, want)
	if cerr == nil {
		return nil
	}
	if !errors.Is(cerr, jetstream.ErrStreamNameAlreadyInUse) {
		return fmt.Errorf("capstan: create the queue of %s (stream %s): %w", principal, want.Name, cerr)
	}
	s, err := existingStream(ctx, js, want.Name)
	if err != nil {
		return fmt.Errorf("capstan: read the queue of %s (stream %s): %w", principal, want.Name, err)
	}
	have := s.CachedInfo().Config
	if !slices.Equal(have.Subjects, want.Subjects) || have.Retention != want.Retention || have.Storage != want.Storage {
		return fmt.Errorf("%w: stream %s is not the queue of %s: %s", ErrConfigConflict, want.Name, principal,
			streamDiff(have, withReplicas(want, have.Replicas)))
	}
	next := have
	next.MaxMsgs, next.MaxBytes, next.Discard = want.MaxMsgs, want.MaxBytes, want.Discard
	next.MaxAge, next.Duplicates = want.MaxAge, want.Duplicates
	if unlimited(have.MaxMsgs) == next.MaxMsgs && unlimited(have.MaxBytes) == next.MaxBytes && have.Discard == next.Discard &&
		have.MaxAge == next.MaxAge && have.Duplicates == next.Duplicates {
		return nil
	}
	if _, err := js.UpdateStream(ctx, next); err != nil {
		return fmt.Errorf("capstan: the queue of %s (stream %s): set its limits: %w", principal, want.Name, err)
	}
	return nil
}

func withReplicas(c jetstream.StreamConfig, r int) jetstream.StreamConfig {
	c.Replicas = r
	return c
}

// retireQueues deletes the empty queues of principals not in want.
func retireQueues(ctx context.Context, js jetstream.JetStream, n Names, want map[string]QueueLimits) error {
	l := js.StreamNames(ctx, jetstream.WithStreamListSubject(n.ExecSubjects()))
	var gone []string
	for name := range l.Name() {
		if p := n.PrincipalOfQueue(name); p != "" {
			if _, ok := want[p]; !ok {
				gone = append(gone, name)
			}
		}
	}
	if err := l.Err(); err != nil {
		return fmt.Errorf("capstan: list queues: %w", err)
	}
	for _, name := range gone {
		s, err := js.Stream(ctx, name)
		if err != nil || s.CachedInfo().State.Msgs > 0 {
			continue // its requests end first; a later push deletes it
		}
		if err := js.DeleteStream(ctx, name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("capstan: delete the queue %s of a removed principal: %w", name, err)
		}
	}
	return nil
}

// ErrQueueFull marks a request its principal's queue refused at its
// publication: the queue holds as many requests, or bytes, as it may. Nothing
// was stored; the same request may be submitted again once the queue drains.
var ErrQueueFull = errors.New("capstan: queue full")

// QueueFullError is a publication a full queue refused.
type QueueFullError struct {
	// Quota is what the queue holds as much of as it may: envelope.QuotaQueuedRequests
	// or envelope.QuotaQueuedBytes.
	Quota string
	// Err is the server's refusal.
	Err error
}

// Error names the quota.
func (e *QueueFullError) Error() string {
	what := "requests"
	if e.Quota == envelope.QuotaQueuedBytes {
		what = "bytes"
	}
	return fmt.Sprintf("capstan: the queue holds as many %s as its principal may have waiting (quota %s): %v", what, e.Quota, e.Err)
}

// Unwrap makes it ErrQueueFull and the server's refusal.
func (e *QueueFullError) Unwrap() []error { return []error{ErrQueueFull, e.Err} }

// errStoreFailed is JetStream's "the message could not be stored", which
// carries, for a stream that discards new messages, the limit it reached.
const errStoreFailed = 10077

// AsQueueFull returns err as a *QueueFullError when it is a queue's refusal
// of a full queue, else nil.
func AsQueueFull(err error) *QueueFullError {
	if err == nil {
		return nil // before the target below, which escapes: every call's path
	}
	var qf *QueueFullError
	if errors.As(err, &qf) {
		return qf
	}
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode != errStoreFailed {
		return nil
	}
	switch {
	case strings.Contains(apiErr.Description, "maximum messages exceeded"):
		return &QueueFullError{Quota: envelope.QuotaQueuedRequests, Err: err}
	case strings.Contains(apiErr.Description, "maximum bytes exceeded"):
		return &QueueFullError{Quota: envelope.QuotaQueuedBytes, Err: err}
	}
	return nil
}

// QueueUsage is what one principal's queue holds and may hold.
type QueueUsage struct {
	// Principal is whose queue it is.
	Principal string `json:"principal"`
	// Stream is the queue's stream (the shared exec stream for a principal
	// without a queue of its own).
	Stream string `json:"stream"`
	// Requests is how many requests it holds: not yet ended.
	Requests uint64 `json:"requests"`
	// Bytes is how many bytes they hold.
	Bytes uint64 `json:"bytes"`
	// MaxRequests is how many requests it may hold; -1: no bound.
	MaxRequests int64 `json:"maxRequests"`
	// MaxBytes is how many bytes it may hold; -1: no bound.
	MaxBytes int64 `json:"maxBytes"`
}

// QueueUsageOf reads principal's queue: its own, or the shared exec stream
// when it has none.
func (b *Broker) QueueUsageOf(ctx context.Context, principal string) (QueueUsage, error) {
	s, err := b.JS.Stream(ctx, b.Names.QueueStream(principal))
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		s, err = b.JS.Stream(ctx, b.Names.ExecStream())
	}
	if err != nil {
		return QueueUsage{}, fmt.Errorf("capstan: read the queue of %s: %w", principal, err)
	}
	return usageOf(principal, s.CachedInfo()), nil
}

func usageOf(principal string, info *jetstream.StreamInfo) QueueUsage {
	return QueueUsage{Principal: principal, Stream: info.Config.Name, Requests: info.State.Msgs, Bytes: info.State.Bytes,
		MaxRequests: unlimited(info.Config.MaxMsgs), MaxBytes: unlimited(info.Config.MaxBytes)}
}

// queueRetryAfter is the wait a refusal of a full queue suggests: a queue
// drains as workers start its requests, at a pace no one can promise.
const queueRetryAfter = time.Second

// QuotaError is the refusal of a request its principal's full queue did not
// take (DESIGN §12 "Quotas"): QUOTA_EXCEEDED, stage queue, exposed to the
// model with the quota, its limit (-1: not known, left out) and when to try
// again (envelope.QuotaExceeded). Nothing of it was stored or run.
func (e *QueueFullError) QuotaError(limit int64) *envelope.CapabilityError {
	what := "requests waiting to start"
	if e.Quota == envelope.QuotaQueuedBytes {
		what = "bytes of requests waiting to start"
	}
	var cerr *envelope.CapabilityError
	if limit >= 0 {
		cerr = envelope.QuotaExceeded(envelope.StageQueue, e.Quota, what, limit, queueRetryAfter)
	} else {
		cerr = envelope.QuotaRefusal(fmt.Sprintf("Over the %s quota: too many %s. Try again in %s.", e.Quota, what, queueRetryAfter),
			map[string]any{"quota": e.Quota, "retryAfterMs": queueRetryAfter.Milliseconds()})
		cerr.Stage = envelope.StageQueue
	}
	cerr.Cause = e
	return cerr
}

// Limit is what q may hold of quota (envelope.QuotaQueuedRequests or
// envelope.QuotaQueuedBytes); -1: no bound.
func (u QueueUsage) Limit(quota string) int64 {
	if quota == envelope.QuotaQueuedBytes {
		return u.MaxBytes
	}
	return u.MaxRequests
}
