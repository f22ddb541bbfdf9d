package notify

import (
	"testing"

	"go.uber.org/goleak"
)

// Every receiver and connection must be gone when the tests end.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
