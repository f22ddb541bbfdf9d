package capstantest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// serveWait bounds how long Worker waits for the worker to serve.
const serveWait = 30 * time.Second

// Option changes how Worker runs its worker.
type Option func(*options)

type options struct {
	cfg  executor.WorkerConfig
	conn *nats.Conn
}

// WithConfig runs the worker with cfg (its pool, concurrency, lease, logger,
// broker configuration) instead of the zero configuration.
func WithConfig(cfg executor.WorkerConfig) Option {
	return func(o *options) { o.cfg = cfg }
}

// WithConn runs the worker over nc instead of a connection to a server of its
// own: a server or cluster the test started, or credentials of its own. The
// test keeps nc; it must stay open until the test ends.
func WithConn(nc *nats.Conn) Option {
	return func(o *options) { o.conn = nc }
}

// Running is a worker Worker started. It is an executor.Worker (Stats, ID)
// with the connection and server it runs on.
type Running struct {
	*executor.Worker
	// Conn is the worker's connection.
	Conn *nats.Conn
	env  *testenv.Env // the server Worker started for it; nil with WithConn

	cfg    executor.WorkerConfig
	stop   func()
	exited chan struct{} // closed when Run returned, runErr set
	runErr error
	told   bool // runErr already failed the test
}

// Worker runs a worker serving reg until the test ends, and returns once it
// serves (executor.Worker.Ready): the catalog lists every capability of reg,
// and a call of any of them reaches a worker that serves it. Unless WithConn
// says otherwise it serves on a new embedded JetStream server (testenv.Start),
// shut down after it. A worker that stops on an error fails the test.
func Worker(t testing.TB, reg *executor.Registry, opts ...Option) *Running {
	t.Helper()
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	r := &Running{Conn: o.conn, cfg: o.cfg}
	if r.Conn == nil {
		r.env = testenv.Start(t)
		r.Conn = r.env.Connect(t)
	}
	w, err := executor.NewWorker(r.Conn, reg, o.cfg)
	if err != nil {
		t.Fatalf("capstantest: %v", err)
	}
	r.Worker = w
	ctx, cancel := context.WithCancel(context.Background())
	r.exited = make(chan struct{})
	go func() {
		defer close(r.exited)
		r.runErr = w.Run(ctx)
	}()
	var once sync.Once
	r.stop = func() {
		once.Do(func() {
			cancel()
			<-r.exited
		})
	}
	t.Cleanup(func() {
		r.stop()
		if r.runErr != nil && !r.told {
			t.Errorf("capstantest: worker: %v", r.runErr)
		}
	})
	if err := r.waitServing(); err != nil {
		t.Fatalf("capstantest: %v", err)
	}
	return r
}

// Stop stops the worker and returns once every delivery it took has ended,
// as the end of the test does; stopping twice is harmless. An error the
// worker stopped on fails the test when it ends.
func (r *Running) Stop() { r.stop() }

// Connect opens a connection to the worker's server, closed when the test
// ends: for a second worker on it (WithConn), or a client of the test's
// own. With WithConn there is no server of Worker's: Connect returns the
// worker's connection, which the test keeps.
func (r *Running) Connect(t testing.TB) *nats.Conn {
	t.Helper()
	if r.env == nil {
		return r.Conn
	}
	return r.env.Connect(t)
}

// Client opens a client with cfg, closed when the test ends: on a connection
// of its own to the worker's server, or on the worker's connection with
// WithConn. A zero cfg.Deployment is the worker's.
func (r *Running) Client(t testing.TB, cfg executor.ClientConfig) *executor.Client {
	t.Helper()
	nc := r.Connect(t)
	if cfg.Deployment == (executor.Deployment{}) {
		cfg.Deployment = r.cfg.Deployment
	}
	c, err := executor.NewClient(nc, cfg)
	if err != nil {
		t.Fatalf("capstantest: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// waitServing waits until the worker serves (executor.Worker.Ready), or
// stops.
func (r *Running) waitServing() error {
	select {
	case <-r.Ready():
		return nil
	case <-r.exited:
		r.told = true
		if r.runErr == nil {
			return errors.New("the worker stopped before it served")
		}
		return fmt.Errorf("the worker stopped before it served: %w", r.runErr)
	case <-time.After(serveWait):
		return fmt.Errorf("the worker does not serve after %s", serveWait)
	}
}

// Server starts a JetStream server for the test, embedded in its process,
// on loopback with a store in the test's temporary directory, and returns
// its URL; it is shut down when the test ends. For a test of a program that
// connects by URL, or of several workers on one server (WithConn).
func Server(t testing.TB) string {
	t.Helper()
	return testenv.Start(t).URL
}
