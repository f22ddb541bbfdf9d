package console_test

import (
	"github.com/capstan-dev/capstan/internal/testenv"
	"testing"

	"go.uber.org/goleak"
)

// Every session, live stream, worker and browser must be gone when the tests
// end.
func TestMain(m *testing.M) {
	testenv.RaiseParallel()
	goleak.VerifyTestMain(m)
}
