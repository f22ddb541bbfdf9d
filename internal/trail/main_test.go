package trail

import (
	"testing"

	"github.com/capstan-dev/capstan/internal/testenv"
	"go.uber.org/goleak"
)

// Every checkpointer, consumer, client and server of the tests must be gone
// when they end.
func TestMain(m *testing.M) {
	testenv.RaiseParallel()
	goleak.VerifyTestMain(m)
}
