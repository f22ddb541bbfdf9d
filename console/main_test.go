package console_test

import (
	"testing"

	"go.uber.org/goleak"
)

// Every session, live stream, worker and browser must be gone when the tests
// end.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
