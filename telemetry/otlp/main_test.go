package otlp_test

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// Every exporter and collector of the tests must be gone when they end.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// ctxT bounds a test's exports: a safety net, not a timing assertion.
func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}
