package auth_test

import (
	"context"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/internal/testhooks"

	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
)

// A producer may not ask for the stream information of the envelopes and
// executions buckets; its client still learns how long envelopes are kept
// (which caps its requests' start windows and tells an expired execution),
// from what provisioning recorded in the catalog.
func TestProducer_LearnsTheEnvelopeRetentionWithoutStreamInfo(t *testing.T) {
	t.Parallel()
	env, setup, _ := secured(t)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	const retention = 3 * time.Hour
	if _, err := broker.Provision(ctx, env.Connect(t), broker.Config{Prefix: setup.Prefix, EnvelopeRetention: retention}); err != nil {
		t.Fatal(err)
	}
	c, err := executor.NewClient(env.ConnectAs(t, "alice"), executor.ClientConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := testhooks.Broker(c).Config.EnvelopeRetention; got != retention {
		t.Fatalf("alice's client reads an envelope retention of %v, want %v", got, retention)
	}
}
