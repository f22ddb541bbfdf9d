package approvalstore_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/capstan-dev/capstan/internal/testenv"
)

// Every store, connection and server a test started is gone when the tests
// end; the tests, each on its server, run several per CPU.
func TestMain(m *testing.M) {
	testenv.RaiseParallel()
	goleak.VerifyTestMain(m)
}
