package broker

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// A request left unanswered is made again and its second answer taken; an
// answer, even an error, is never asked for twice; and the caller's context
// still ends the wait.
func TestUntilAnswered_AsksAgainOnlyWhatWentUnanswered(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	calls := 0
	got, err := untilAnswered(ctx, func(ctx context.Context) (int, error) {
		calls++
		if calls == 1 {
			<-ctx.Done() // the answer is lost
			return 0, ctx.Err()
		}
		return 7, nil
	})
	if got != 7 || err != nil || calls != 2 {
		t.Fatalf("got %d, %v after %d requests; want 7 after 2", got, err, calls)
	}

	calls = 0
	_, err = untilAnswered(ctx, func(ctx context.Context) (int, error) {
		calls++
		return 0, jetstream.ErrStreamNameAlreadyInUse
	})
	if !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) || calls != 1 {
		t.Fatalf("an answered error: %v after %d requests, want it after 1", err, calls)
	}

	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	calls = 0
	_, err = untilAnswered(short, func(ctx context.Context) (int, error) {
		calls++
		<-ctx.Done()
		return 0, ctx.Err()
	})
	if !errors.Is(err, context.DeadlineExceeded) || calls != 1 {
		t.Fatalf("the caller's deadline: %v after %d requests, want it after 1", err, calls)
	}
}
