package broker_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
)

func TestMain(m *testing.M) {
	testenv.RaiseParallel()
	goleak.VerifyTestMain(m)
}

// testCtx bounds each JetStream call so a broken server fails the test instead of
// hanging it; it is a safety net, not a timing assertion.
func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// provision provisions cfg on nc and fails the test on error.
func provision(t *testing.T, nc *nats.Conn, cfg broker.Config) *broker.Broker {
	t.Helper()
	b, err := broker.Provision(testCtx(t), nc, cfg)
	if err != nil {
		t.Fatalf("provision %+v: %v", cfg, err)
	}
	return b
}
