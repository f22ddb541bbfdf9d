package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/capstan-dev/capstan/capstantest"
	"github.com/capstan-dev/capstan/executor"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// The program's one round trip, against a real embedded JetStream.
func TestHello_OneCallCompletes(t *testing.T) {
	url := capstantest.Server(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second) // a safety net
	defer cancel()
	var out strings.Builder
	if err := run(ctx, executor.ConnectOptions{URL: url}, &out); err != nil {
		t.Fatal(err)
	}
	if got, want := out.String(), "completed 1 Hello, Ada!\n"; got != want {
		t.Fatalf("printed %q, want %q", got, want)
	}
}

// Against a deployment another worker already serves (capstan dev's demo
// worker, here one capability of its own pool), the program's call reaches
// its own worker: it calls once that worker is ready, and the other worker,
// which does not serve greet.hello, leaves the call to it.
func TestHello_AgainstARunningDeployment(t *testing.T) {
	url := capstantest.Server(t)
	echo := executor.Define("demo.echo", executor.Meta{
		Description: "Returns its input.",
		Expose:      executor.On(executor.SurfaceDirect),
		SideEffect:  executor.SideEffectNone,
	}, func(ctx context.Context, call executor.Call[map[string]any]) (map[string]any, error) {
		return call.Input, nil
	})
	reg, err := executor.NewRegistry(echo)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := executor.Connect(executor.ConnectOptions{URL: url})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	demo := capstantest.Worker(t, reg, capstantest.WithConn(nc))
	for range 3 { // each run starts a new worker of greet.hello, and calls at once
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second) // a safety net
		var out strings.Builder
		err := run(ctx, executor.ConnectOptions{URL: url}, &out)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if got, want := out.String(), "completed 1 Hello, Ada!\n"; got != want {
			t.Fatalf("printed %q, want %q", got, want)
		}
	}
	if n := demo.Stats().Finalized; n != 0 {
		t.Fatalf("the other worker finalized %d calls", n)
	}
}
