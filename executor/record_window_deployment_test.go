package executor_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// Two workers of one deployment cannot run with different record windows
// (DESIGN §16): judging "no record" by different windows, one could take a
// request for new that the other ran and whose record went. A worker set to
// another window than the one the deployment's first worker recorded
// refuses to start, with ErrRecordWindow, and writes nothing; one set to
// none adopts the deployment's and serves.
func TestRecordWindow_WorkersWithAnotherWindowRefuseToStart(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	var calls atomic.Int64
	_, stopFirst := runWorker(t, env.Connect(t), executor.WorkerConfig{ID: "first", Deployment: executor.Deployment{RecordWindow: 2 * time.Second}},
		echoCap(&calls))
	c := newClient(t, env.Connect(t))
	call := func() {
		t.Helper()
		got, err := c.Call(ctxT(t), "demo.echo", map[string]any{"hello": "x"})
		if err != nil || got.Error != nil {
			t.Fatalf("call: %v, %+v", err, got)
		}
	}
	call()

	reg, err := executor.NewRegistry(echoCap(&calls))
	if err != nil {
		t.Fatal(err)
	}
	other, err := executor.NewWorker(env.Connect(t), reg, executor.WorkerConfig{ID: "other",
		Deployment: executor.Deployment{RecordWindow: 5 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = other.Run(ctx)
	if !errors.Is(err, broker.ErrRecordWindow) || !errors.Is(err, broker.ErrConfigConflict) || ctx.Err() != nil {
		t.Fatalf("a worker set to another window: Run returned %v, want ErrRecordWindow at once", err)
	}
	if s := other.Stats(); s.Handled != 0 || s.Finalized != 0 {
		t.Fatalf("the refused worker handled %d deliveries, finalized %d", s.Handled, s.Finalized)
	}

	// One set to none adopts the deployment's window: with the first worker
	// stopped, it serves alone.
	_, stopAdopter := runWorker(t, env.Connect(t), executor.WorkerConfig{ID: "adopter"}, echoCap(&calls))
	defer stopAdopter()
	stopFirst()
	before := calls.Load()
	call()
	if calls.Load() != before+1 {
		t.Fatalf("handler calls %d, want %d", calls.Load(), before+1)
	}
	b, err := broker.Provision(ctxT(t), env.Connect(t), broker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if w, err := b.RecordWindow(ctxT(t)); err != nil || w != 2*time.Second {
		t.Fatalf("the deployment's window: %v (%v), want the first worker's 2s", w, err)
	}
}
