package capstantest_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/capstan-dev/capstan/capstantest"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/capstan-dev/capstan/internal/testhooks"
)

// Every worker, client and server a test started is gone when the tests end.
func TestMain(m *testing.M) {
	testenv.RaiseParallel()
	goleak.VerifyTestMain(m)
}

var ada = envelope.Actor{Kind: envelope.ActorUser, ID: "ada"}

func echo(id string) executor.Capability {
	return executor.Define(id, executor.Meta{
		Description: "Returns its input.", Expose: executor.On(executor.SurfaceDirect), SideEffect: executor.SideEffectNone,
	}, func(ctx context.Context, c executor.Call[Greeting]) (Greeting, error) { return c.Input, nil })
}

func registry(t *testing.T, caps ...executor.Capability) *executor.Registry {
	t.Helper()
	reg, err := executor.NewRegistry(caps...)
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

func call(t *testing.T, c *executor.Client, id string) *envelope.Envelope {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	env, err := c.Call(ctx, id, Greeting{Name: "Ada"})
	if err != nil {
		t.Fatal(err)
	}
	return env
}

// Worker returns once the catalog lists every capability of the registry,
// not only the first, and each of them is then served.
func TestWorker_ReturnsOnceEveryCapabilityIsListed(t *testing.T) {
	t.Parallel()
	ids := []string{"t.one", "t.two", "t.three"}
	w := capstantest.Worker(t, registry(t, echo(ids[0]), echo(ids[1]), echo(ids[2])))
	if second := w.Connect(t); second == w.Conn || second.ConnectedUrl() != w.Conn.ConnectedUrl() {
		t.Fatal("Worker started no server of its own, or Connect reaches another")
	}
	c := w.Client(t, executor.ClientConfig{Actor: ada})
	for _, id := range ids {
		if _, err := testhooks.Broker(c).Catalog.Get(context.Background(), id); err != nil {
			t.Fatalf("the catalog does not list %s once Worker returned: %v", id, err)
		}
	}
	for _, id := range ids {
		if env := call(t, c, id); env.Status != envelope.StatusCompleted {
			t.Fatalf("%s: %s %+v", id, env.Status, env.Error)
		}
	}
}

// WithConn runs the worker on the test's server and connection, and its
// configuration reaches the worker and its clients: a pool of its own and
// resources under another prefix.
func TestWorker_WithConnAndConfig(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	cfg := executor.WorkerConfig{Pool: "greeters", Deployment: executor.Deployment{Prefix: "OTHER"}}
	w := capstantest.Worker(t, registry(t, echo("t.echo")), capstantest.WithConn(env.Connect(t)), capstantest.WithConfig(cfg))
	if w.Connect(t) != w.Conn || w.Conn.ConnectedUrl() != env.Connect(t).ConnectedUrl() {
		t.Fatal("Worker started a server of its own beside the test's")
	}
	c := w.Client(t, executor.ClientConfig{Actor: ada})
	if got := testhooks.Broker(c).Names.ExecStream(); got != broker.NewNames("OTHER").ExecStream() {
		t.Fatalf("the client opened %s, not the worker's resources", got)
	}
	if env := call(t, c, "t.echo"); env.Status != envelope.StatusCompleted {
		t.Fatalf("%s %+v", env.Status, env.Error)
	}
	if _, err := broker.Open(context.Background(), env.Connect(t), broker.Config{Prefix: "OTHER"}); err != nil {
		t.Fatalf("no resources under the worker's prefix on the test's server: %v", err)
	}
	if _, err := testhooks.Broker(c).JS.Consumer(context.Background(), testhooks.Broker(c).Names.ExecStream(), testhooks.Broker(c).Names.PoolConsumer("greeters")); err != nil {
		t.Fatalf("the worker's pool has no consumer: %v", err)
	}
}

// Stop returns once the worker is gone: an execution it held has had its
// context ended (the grace is short), and a second Stop returns at once.
func TestStop_ReturnsOnceTheWorkerIsGone(t *testing.T) {
	t.Parallel()
	// The handler's context, handed out as it starts: Stop guarantees that
	// it has ended, not that the handler's goroutine has run since (a
	// handler is abandoned, not waited for, once its context ends).
	started := make(chan context.Context, 1)
	hold := executor.Define("t.hold", executor.Meta{
		Description: "Holds until its context ends.", Expose: executor.On(executor.SurfaceDirect), SideEffect: executor.SideEffectRead,
	}, func(ctx context.Context, c executor.Call[Greeting]) (Greeting, error) {
		started <- ctx
		<-ctx.Done()
		return Greeting{}, ctx.Err()
	})
	w := capstantest.Worker(t, registry(t, hold), capstantest.WithConfig(executor.WorkerConfig{Grace: 100 * time.Millisecond}))
	c := w.Client(t, executor.ClientConfig{Actor: ada})
	if _, err := c.Submit(context.Background(), "t.hold", Greeting{}); err != nil {
		t.Fatal(err)
	}
	var handlerCtx context.Context
	select {
	case handlerCtx = <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("the execution never started")
	}
	w.Stop()
	if handlerCtx.Err() == nil {
		t.Fatal("Stop returned while the execution it held still had its context")
	}
	w.Stop()
}

// Server gives each call a server of its own, with JetStream, reachable at
// the URL it returns.
func TestServer_OwnJetStreamServerPerCall(t *testing.T) {
	t.Parallel()
	a, b := capstantest.Server(t), capstantest.Server(t)
	if a == b {
		t.Fatalf("two servers share the URL %s", a)
	}
	nc, err := executor.Connect(executor.ConnectOptions{URL: a})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.AccountInfo(context.Background()); err != nil {
		t.Fatalf("no JetStream at %s: %v", a, err)
	}
}
