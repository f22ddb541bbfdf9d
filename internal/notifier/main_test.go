package notifier

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/capstan-dev/capstan/internal/testenv"
)

// Every notifier, receiver, worker and connection must be gone when the
// tests end.
func TestMain(m *testing.M) {
	testenv.RaiseParallel()
	goleak.VerifyTestMain(m)
}
