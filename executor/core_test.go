package executor_test

import (
	"sync/atomic"
	"testing"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/testenv"
)

func TestCall_EchoCompletesWithOneEnvelope(t *testing.T) {
	env := testenv.Start(t)
	nc := env.Connect(t)
	var calls atomic.Int64
	startWorker(t, nc, executor.WorkerConfig{}, echoCap(&calls))
	c := newClient(t, env.Connect(t))

	got, err := c.Call(ctxT(t), "demo.echo", map[string]any{"hello": "world"})
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != envelope.StatusCompleted {
		t.Fatalf("status %s, error %+v", got.Status, got.Error)
	}
	var out echoIn
	if err := got.Output.Decode(&out); err != nil || out.Hello != "world" {
		t.Fatalf("output %+v, err %v", out, err)
	}
	if got.Attempts != 1 || calls.Load() != 1 {
		t.Fatalf("attempts %d, calls %d", got.Attempts, calls.Load())
	}
}
