package executor_test

import (
	"context"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/internal/testhooks"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
)

// A takeover runs only the handler: the stages ran for the attempt that was
// lost. That holds for the request the attempt ran, not for another request
// a producer publishes under the same execution id (its own id: records are
// the producer's, and the message id is its to choose, so the dedup does not
// stop it). Here the first request is an approved resume that holds in a
// worker process; the second, under its id, calls a capability of another
// pool that needs an approval it never got. The worker process is killed: the
// second request must not run as the takeover of the first.
func TestTakeover_AnotherRequestUnderTheSameIDDoesNotRunWithoutItsApproval(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("kills a worker process")
	}
	const lease = 2 * time.Second
	env, js := vaultEnv(t)
	c := newClient(t, env.Connect(t))
	victim := workerProcess(t, env.URL, "takeover-victim", lease)
	waitProcessesServing(t, env.Server, "takeover-victim")

	var gateRuns atomic.Int64
	gate := executor.Define("gate.pay", executor.Meta{
		Description: "Pays, once approved; deduplicated by the idempotency key.",
		Expose:      executor.On(executor.SurfaceDirect), SideEffect: executor.SideEffectWrite, Idempotent: true,
		Retry:    &executor.Retry{MaxAttempts: 1, Backoff: 10 * time.Millisecond},
		Approval: &executor.ApprovalRule{Required: true, Reason: "payments need a second pair of eyes"},
	}, func(ctx context.Context, call executor.Call[vaultInput]) (string, error) {
		gateRuns.Add(1)
		return "paid", nil
	})
	startWorker(t, env.Connect(t), executor.WorkerConfig{Pool: "gate", Lease: lease}, gate)

	// Called plainly, gate.pay needs an approval.
	requireApproval(t, c, "gate.pay", vaultInput{Account: "a1", Amount: 10}, executor.As(alice))

	// The first request: an approved resume, holding in the worker process.
	_, rec := requireApproval(t, c, "vault.transfer", vaultInput{Account: "a1", Amount: 10, HoldMs: 600_000}, executor.As(alice))
	decide(t, c, rec.ID, true)
	id, err := c.SubmitResume(ctxT(t), rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the handler's effect", func() bool { return effects(t, js, rec.ID) > 0 })

	// The second request, under the same id, with a message id of its own.
	input, err := envelope.NewRaw(vaultInput{Account: "a1", Amount: 999})
	if err != nil {
		t.Fatal(err)
	}
	body, err := envelope.Marshal(&envelope.Request{V: envelope.Version, ExecutionID: id, CapabilityID: "gate.pay",
		Input: input, Actor: alice, Surface: string(executor.SurfaceDirect), SubmittedAt: time.Now().UTC()})
	if err != nil {
		t.Fatal(err)
	}
	n := broker.NewNames("")
	m := nats.NewMsg(n.ExecSubject(broker.Anonymous, "gate.pay"))
	m.Data = body
	m.Header.Set(jetstream.MsgIDHeader, broker.Key(broker.Anonymous, id)+".second")
	if _, err := js.PublishMsg(ctxT(t), m); err != nil {
		t.Fatal(err)
	}

	if err := victim.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = victim.Wait()

	// No worker serves the vault now. Once the lease ran out, the gate's
	// worker decides on the second request: settled, or an envelope for id.
	pool, err := js.Consumer(ctxT(t), n.ExecStream(), n.PoolConsumer("gate"))
	if err != nil {
		t.Fatal(err)
	}
	b := testhooks.Broker(c)
	waitUntil(t, "the second request settled", func() bool {
		if _, _, err := broker.Load[envelope.Envelope](ctxT(t), b.Envelopes, broker.Key(broker.Anonymous, id)); err == nil {
			return true
		}
		info, err := pool.Info(ctxT(t))
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0
	})
	if runs := gateRuns.Load(); runs != 0 {
		env, _, _ := broker.Load[envelope.Envelope](ctxT(t), b.Envelopes, broker.Key(broker.Anonymous, id))
		t.Fatalf("gate.pay ran %d times without an approval, as the takeover of %s; envelope %+v", runs, id, env)
	}
}
