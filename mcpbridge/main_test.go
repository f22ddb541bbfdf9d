package mcpbridge_test

import (
	"testing"

	"github.com/capstan-dev/capstan/internal/testenv"

	"go.uber.org/goleak"
)

// Every bridge, session, follower and worker must be gone when the tests end.
func TestMain(m *testing.M) {
	testenv.RaiseParallel()
	goleak.VerifyTestMain(m)
}
