package telemetry_test

import (
	"github.com/capstan-dev/capstan/internal/testenv"
	"testing"

	"go.uber.org/goleak"
)

// Every worker, client and server of the tests must be gone when they end.
func TestMain(m *testing.M) {
	testenv.RaiseParallel()
	goleak.VerifyTestMain(m)
}
