package executor_test

import (
	"testing"

	"go.uber.org/goleak"
)

// Every worker, client, lease keeper and abandoned handler must be gone when
// the tests end.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
