package executor_test

import (
	"context"
	"errors"
	"testing"

	"github.com/capstan-dev/capstan/testenv"
)

// An id that can never name an execution is refused at once, as Status and
// Cancel refuse it: awaiting it would wait for the whole context for an
// envelope that cannot exist.
func TestAwait_InvalidExecutionIDRefusedAtOnce(t *testing.T) {
	env := testenv.Start(t)
	c := newClient(t, env.Connect(t))
	ctx := ctxT(t)
	for _, id := range []string{"", "a.b", "a.*", ">", "bad id"} {
		got, err := c.Await(ctx, id)
		if err == nil || got != nil {
			t.Fatalf("Await(%q) = %v, %v; want an error", id, got, err)
		}
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
			t.Fatalf("Await(%q) waited for the context: %v", id, err)
		}
	}
}
