package engine

import (
	"context"
	"errors"
	"testing"
)

// The reconciler asked about a lost attempt runs under a context that the
// claim's loss and the worker's shutdown end, and a cancel or the request's
// deadline do not: its answer says what became of an attempt no cancel
// stops. It ends with the execution.
func TestUntilLost_EndsByTheClaimsLossAndShutdownNotByACancel(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cause error
		ends  bool
	}{
		{errCallerCancelled, false},
		{&operatorCancel{reason: "incident"}, false},
		{errDeadline, false},
		{errLeaseLost, true},
		{errShutdown, true},
	} {
		ctx, cancel := context.WithCancelCause(context.Background())
		done := make(chan struct{})
		lost := untilLost(ctx, done)
		cancel(tc.cause)
		if tc.ends {
			<-lost.Done()
			if !errors.Is(context.Cause(lost), tc.cause) {
				t.Errorf("%v: ended with %v", tc.cause, context.Cause(lost))
			}
			continue
		}
		if lost.Err() != nil {
			t.Errorf("%v ended it: %v", tc.cause, context.Cause(lost))
		}
		close(done) // the execution ends
		<-lost.Done()
	}
}
