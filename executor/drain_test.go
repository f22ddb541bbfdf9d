package executor_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/capstan-dev/capstan/internal/testhooks"
)

// TestDrain_AStoppingWorkerStartsNoQueuedWrite: a worker told to stop
// finishes what it runs, but a request it had pulled and not yet started
// is left to another worker. Started during the drain, a write outlasting
// the grace would be abandoned mid-attempt and end OUTCOME_UNKNOWN, though
// nothing had begun it when the stop came.
func TestDrain_AStoppingWorkerStartsNoQueuedWrite(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	var mu sync.Mutex
	runs := map[string][]string{} // execution id: the workers that ran it
	release := map[string]chan struct{}{}
	started := make(chan string, 4)
	post := func(worker string) executor.Capability {
		return executor.Define("ledger.post", executor.Meta{
			Description: "Posts an entry; never retried.",
			Expose:      executor.On(executor.SurfaceDirect),
			SideEffect:  executor.SideEffectWrite,
			Timeout:     time.Hour,
		}, func(ctx context.Context, c executor.Call[none]) (map[string]any, error) {
			mu.Lock()
			runs[c.ExecutionID] = append(runs[c.ExecutionID], worker)
			ch := release[c.ExecutionID]
			mu.Unlock()
			started <- c.ExecutionID
			select {
			case <-ch:
				return map[string]any{"posted": true}, nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		})
	}
	draining := make(chan struct{})
	var once sync.Once
	logs := slog.New(&onMessage{msg: "worker draining", do: func() { once.Do(func() { close(draining) }) }})
	first := runWorkerOn(t, env.Connect(t), executor.WorkerConfig{Concurrency: 1, Grace: time.Second, ID: "first", Logger: logs}, post("first"))
	c := newClient(t, env.Connect(t))
	ctx := ctxT(t)

	a, b := envelope.NewExecutionID(), envelope.NewExecutionID()
	mu.Lock()
	release[a], release[b] = make(chan struct{}), make(chan struct{})
	mu.Unlock()
	if _, err := c.Submit(ctx, "ledger.post", nil, executor.WithID(a)); err != nil {
		t.Fatal(err)
	}
	if got := <-started; got != a {
		t.Fatalf("started %s, want %s", got, a)
	}
	if _, err := c.Submit(ctx, "ledger.post", nil, executor.WithID(b)); err != nil {
		t.Fatal(err)
	}
	// Both requests are delivered to the first worker: a runs, b waits for
	// its slot.
	cons, err := testhooks.Broker(c).Exec.Consumer(ctx, "pool-default")
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "both requests delivered", func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumAckPending == 2 && info.NumPending == 0
	})

	stopped := make(chan struct{})
	go func() { first.Stop(); close(stopped) }()
	waitClosed(t, draining, "the first worker never drained")
	close(release[a]) // a ends within the grace
	<-stopped

	startWorker(t, env.Connect(t), executor.WorkerConfig{ID: "second"}, post("second"))
	close(release[b])
	for _, id := range []string{a, b} {
		got, err := c.Await(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if got.Status != envelope.StatusCompleted {
			mu.Lock()
			t.Errorf("%s: envelope %s %+v, ran on %v", id, got.Status, got.Error, runs[id])
			mu.Unlock()
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(runs[a]) != 1 || len(runs[b]) != 1 || runs[b][0] != "second" {
		t.Errorf("runs %v: want a once on the first worker, b once on the second", runs)
	}
}

// onMessage is a log handler that calls do at every record whose message is
// msg, and drops every record.
type onMessage struct {
	msg string
	do  func()
}

func (h *onMessage) Enabled(context.Context, slog.Level) bool { return true }
func (h *onMessage) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg {
		h.do()
	}
	return nil
}
func (h *onMessage) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *onMessage) WithGroup(string) slog.Handler      { return h }
