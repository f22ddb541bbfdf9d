package broker

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Bounds of one provisioning request's wait for its answer: the first waits
// firstAnswerWait, each one sent again twice as long, up to lastAnswerWait,
// and at most answerAttempts are made (22 s in all) before the timeout is
// the request's error.
const (
	firstAnswerWait = 2 * time.Second
	lastAnswerWait  = 8 * time.Second
	answerAttempts  = 4
	// existingStreamWait bounds how long a stream known to exist may read as
	// not found: a server of a cluster learns of a new stream a moment after
	// its create is answered.
	existingStreamWait = 5 * time.Second
)

// resending is the JetStream API as provisioning uses it: a request left
// unanswered is sent again. A clustered server can drop the answer to a
// create or an update of a stream that another process creates or updates at
// the same moment — every process provisions at start, often together — and
// the caller would wait for it until its context ends. Every request sent
// through it is idempotent: a create of a stream or bucket that exists with
// the same configuration returns it, an update to the configuration a stream
// has changes nothing, a read reads.
type resending struct{ jetstream.JetStream }

func (r resending) CreateStream(ctx context.Context, cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	return untilAnswered(ctx, func(ctx context.Context) (jetstream.Stream, error) { return r.JetStream.CreateStream(ctx, cfg) })
}

func (r resending) UpdateStream(ctx context.Context, cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	return untilAnswered(ctx, func(ctx context.Context) (jetstream.Stream, error) { return r.JetStream.UpdateStream(ctx, cfg) })
}

func (r resending) Stream(ctx context.Context, name string) (jetstream.Stream, error) {
	return untilAnswered(ctx, func(ctx context.Context) (jetstream.Stream, error) { return r.JetStream.Stream(ctx, name) })
}

func (r resending) CreateKeyValue(ctx context.Context, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	return untilAnswered(ctx, func(ctx context.Context) (jetstream.KeyValue, error) { return r.JetStream.CreateKeyValue(ctx, cfg) })
}

func (r resending) KeyValue(ctx context.Context, bucket string) (jetstream.KeyValue, error) {
	return untilAnswered(ctx, func(ctx context.Context) (jetstream.KeyValue, error) { return r.JetStream.KeyValue(ctx, bucket) })
}

// untilAnswered makes a request again while it goes unanswered, until ctx
// ends or answerAttempts were made.
func untilAnswered[T any](ctx context.Context, request func(context.Context) (T, error)) (T, error) {
	wait := firstAnswerWait
	for n := 1; ; n++ {
		attempt, cancel := context.WithTimeout(ctx, wait)
		v, err := request(attempt)
		cancel()
		unanswered := errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout)
		if !unanswered || ctx.Err() != nil || n == answerAttempts {
			return v, err
		}
		wait = min(2*wait, lastAnswerWait)
	}
}

// existingStream reads a stream that exists: one just created (here or by
// another process) is read again while it reads as not found, for at most
// existingStreamWait.
func existingStream(ctx context.Context, js jetstream.JetStream, name string) (jetstream.Stream, error) {
	give := time.Now().Add(existingStreamWait)
	for {
		s, err := js.Stream(ctx, name)
		if !errors.Is(err, jetstream.ErrStreamNotFound) || time.Now().After(give) {
			return s, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(50 * time.Millisecond):
		}
	}
}
