package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/capstan-dev/capstan/broker"
	"github.com/capstan-dev/capstan/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// The program's one round trip, against a real embedded JetStream.
func TestHello_OneCallCompletes(t *testing.T) {
	env := testenv.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second) // a safety net
	defer cancel()
	var out strings.Builder
	if err := run(ctx, broker.ConnectOptions{URL: env.URL}, &out); err != nil {
		t.Fatal(err)
	}
	if got, want := out.String(), "completed 1 Hello, Ada!\n"; got != want {
		t.Fatalf("printed %q, want %q", got, want)
	}
}
