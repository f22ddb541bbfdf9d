package mcpbridge_test

import (
	"testing"

	"go.uber.org/goleak"
)

// Every bridge, session, follower and worker must be gone when the tests end.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
