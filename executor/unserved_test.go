package executor_test

import (
	"errors"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
)

func clientUnserved(t *testing.T, env *testenv.Env, u executor.Unserved) *executor.Client {
	t.Helper()
	nc := env.Connect(t)
	if _, err := broker.Provision(ctxT(t), nc, broker.Config{}); err != nil {
		t.Fatal(err)
	}
	c, err := executor.NewClient(nc, executor.ClientConfig{Actor: alice, Unserved: u})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// With no worker running at all, a call is told so at once, not at the end
// of its wait: by default its request stays queued (status and listings say
// so), and a worker started later runs it; refused, nothing is stored.
func TestUnserved_NoWorkerAtAll_SaidAtOnce_QueuedOrRefused(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	queue := clientUnserved(t, env, executor.UnservedQueue)
	refuse := clientUnserved(t, env, executor.UnservedRefuse)
	ctx := ctxT(t) // a failure guard: the answer comes without waiting for it

	got, err := queue.Call(ctx, "demo.echo", echoIn{Hello: "anyone?"})
	var u *executor.UnservedError
	if !errors.As(err, &u) || !errors.Is(err, executor.ErrUnserved) || got != nil {
		t.Fatalf("call with no worker: %+v, %v; want an *UnservedError", got, err)
	}
	if !u.Queued || u.ExecutionID == "" || u.Pool != "" || u.CapabilityID != "demo.echo" {
		t.Fatalf("unserved %+v", u)
	}
	t.Log(err)
	// Nothing answers for it but the client itself (an open server): queued.
	v, err := queue.Execution(ctx, executor.ExecutionRequest{ExecutionID: u.ExecutionID, Owner: queue.Principal(), Probe: true})
	if err != nil || v.State != executor.ExecQueued {
		t.Fatalf("probe of the queued request: %+v, %v", v, err)
	}

	_, err = refuse.Call(ctx, "demo.echo", echoIn{Hello: "no queue"})
	var r *executor.UnservedError
	if !errors.As(err, &r) || r.Queued {
		t.Fatalf("refused call: %v", err)
	}
	if v, err := refuse.Execution(ctx, executor.ExecutionRequest{ExecutionID: r.ExecutionID, Owner: refuse.Principal(), Probe: true}); err != nil || v.State != executor.ExecUnknown {
		t.Fatalf("a refused call was stored: %+v, %v", v, err)
	}
	if _, err := refuse.Submit(ctx, "demo.echo", echoIn{}); !errors.Is(err, executor.ErrUnserved) {
		t.Fatalf("refused submit: %v", err)
	}

	// A worker started later runs the queued request.
	startWorker(t, env.Connect(t), executor.WorkerConfig{Pool: "p"}, echoCap(nil))
	done, err := queue.Await(ctx, u.ExecutionID)
	if err != nil || done.Status != envelope.StatusCompleted {
		t.Fatalf("the queued request once a worker serves it: %+v, %v", done, err)
	}
}

// A capability whose pool went down (its workers stopped, their catalog
// entries lapsed) is told as such, naming the pool to start; UnservedWait
// waits for a worker instead.
func TestUnserved_PoolDown_NamesThePool(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	cfg := executor.WorkerConfig{Pool: "echoes", CatalogTTL: 900 * time.Millisecond}
	_, stop := runWorker(t, env.Connect(t), cfg, echoCap(nil))
	// Another pool's worker answers the workers' requests meanwhile.
	startWorker(t, env.Connect(t), executor.WorkerConfig{Pool: "other"}, failing("other.task", executor.Meta{SideEffect: executor.SideEffectNone}, false, nil))
	queue := clientUnserved(t, env, executor.UnservedQueue)
	wait := clientUnserved(t, env, executor.UnservedWait)
	ctx := ctxT(t)
	if err := queue.Serving(ctx, "demo.echo"); err != nil {
		t.Fatalf("served: %v", err)
	}
	stop()
	waitUntil(t, "the pool's entries lapse", func() bool { return queue.Serving(ctx, "demo.echo") != nil })

	_, err := queue.Call(ctx, "demo.echo", echoIn{Hello: "pool?"})
	var u *executor.UnservedError
	if !errors.As(err, &u) || u.Pool != "echoes" || !u.Queued || u.LapsedAt.IsZero() {
		t.Fatalf("call to a pool that is down: %v (%+v)", err, u)
	}
	t.Log(err)
	// The workers' listing shows it queued, first.
	page, err := queue.Executions(ctx, executor.ExecutionsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Entries) == 0 || page.Entries[0].ExecutionID != u.ExecutionID || page.Entries[0].Status != audit.EntryQueued ||
		page.Entries[0].CapabilityID != "demo.echo" || page.Entries[0].Actor.ID != alice.ID {
		t.Fatalf("listing %+v", page.Entries)
	}
	if v, err := queue.Execution(ctx, executor.ExecutionRequest{ExecutionID: u.ExecutionID, Probe: true}); err != nil || v.State != executor.ExecQueued {
		t.Fatalf("probe: %+v, %v", v, err)
	}

	calls := make(chan *envelope.Envelope, 1)
	go func() {
		got, err := wait.Call(ctx, "demo.echo", echoIn{Hello: "I wait"})
		if err != nil {
			t.Error(err)
		}
		calls <- got
	}()
	startWorker(t, env.Connect(t), cfg, echoCap(nil))
	if got := <-calls; got == nil || got.Status != envelope.StatusCompleted {
		t.Fatalf("a waiting call once its pool is back: %+v", got)
	}
	if got, err := queue.Await(ctx, u.ExecutionID); err != nil || got.Status != envelope.StatusCompleted {
		t.Fatalf("the queued call once its pool is back: %+v, %v", got, err)
	}
}
