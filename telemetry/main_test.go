package telemetry_test

import (
	"testing"

	"go.uber.org/goleak"
)

// Every worker, client and server of the tests must be gone when they end.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
