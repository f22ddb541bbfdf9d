package executor_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/capstan-dev/capstan/internal/testhooks"
)

// steppedReport reports step n of steps, then waits for the test to let it
// go on (next), so that a test sees each report before the next one is made:
// no wall clock decides what it sees.
func steppedReport(steps int, next <-chan struct{}) executor.Capability {
	return executor.Define("test.report", executor.Meta{
		Description: "Reports its progress step by step.",
		Expose:      executor.On(executor.SurfaceDirect),
		SideEffect:  executor.SideEffectNone,
		Timeout:     time.Hour,
	}, func(ctx context.Context, c executor.Call[map[string]any]) (map[string]any, error) {
		for n := 1; n <= steps; n++ {
			c.Progress(float64(n), float64(steps), "step")
			select {
			case <-next:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return map[string]any{"steps": steps}, nil
	})
}

// progressLog collects what a WithProgress callback receives.
type progressLog struct {
	mu    sync.Mutex
	got   []executor.Progress
	after atomic.Bool // set once the call returned: nothing may come then
	late  atomic.Int64
}

func (l *progressLog) add(p executor.Progress) {
	if l.after.Load() {
		l.late.Add(1)
	}
	l.mu.Lock()
	l.got = append(l.got, p)
	l.mu.Unlock()
}

func (l *progressLog) last() *executor.Progress {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.got) == 0 {
		return nil
	}
	p := l.got[len(l.got)-1]
	return &p
}

func (l *progressLog) all() []executor.Progress {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]executor.Progress(nil), l.got...)
}

// A handler's progress reaches the caller of Call as it is reported, and
// the record as of the lease's next renewal, with no write of its own; the
// callback is never called after the call returned.
func TestProgress_ReachesTheCallerAndTheRecord(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	next := make(chan struct{})
	// A short lease: renewals every 300 ms fold the last report into the record.
	startWorker(t, env.Connect(t), executor.WorkerConfig{ID: "w", Lease: 900 * time.Millisecond}, steppedReport(3, next))
	c := newClient(t, env.Connect(t))
	// A subscriber that never reads, with the smallest buffer: it costs the
	// handler nothing.
	slow := env.Connect(t)
	stuck, err := slow.SubscribeSync(testhooks.Broker(c).Names.ProgressSubjectsOf(broker.Anonymous))
	if err != nil {
		t.Fatal(err)
	}
	_ = stuck.SetPendingLimits(1, 1)

	var log progressLog
	id := envelope.NewExecutionID()
	type result struct {
		env *envelope.Envelope
		err error
	}
	done := make(chan result, 1)
	go func() {
		e, err := c.Call(executor.WithProgress(ctxT(t), log.add), "test.report", nil, executor.WithID(id))
		log.after.Store(true)
		done <- result{e, err}
	}()
	for step := 1; step <= 3; step++ {
		waitUntil(t, "progress of step "+string(rune('0'+step)), func() bool {
			p := log.last()
			return p != nil && p.Done == float64(step)
		})
		p := log.last()
		if p.Total != 3 || p.Message != "step" || p.Attempt != 1 || p.ExecutionID != id || p.V != envelope.Version || p.At.IsZero() {
			t.Fatalf("step %d: %+v", step, p)
		}
		if step == 2 {
			// The record shows it once a renewal wrote it.
			waitUntil(t, "the record's progress", func() bool {
				st, err := c.Status(ctxT(t), id)
				return err == nil && st.Record != nil && st.Record.Progress != nil && st.Record.Progress.Done == 2
			})
		}
		next <- struct{}{}
	}
	res := <-done
	if res.err != nil || res.env.Status != envelope.StatusCompleted {
		t.Fatalf("%v %+v", res.err, res.env)
	}
	for i, p := range log.all() {
		if i > 0 && p.Done < log.all()[i-1].Done {
			t.Fatalf("progress out of order: %+v", log.all())
		}
	}
	if n := log.late.Load(); n != 0 {
		t.Fatalf("%d reports handed over after the call returned", n)
	}
}

// A handler that never reports publishes nothing and writes nothing of
// progress: nothing on any progress subject, no field in its record.
func TestProgress_AHandlerThatNeverReportsPublishesNothing(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	workerNC := env.Connect(t)
	startWorker(t, workerNC, executor.WorkerConfig{ID: "w"}, echoCap(nil))
	c := newClient(t, env.Connect(t))
	watcher := env.Connect(t)
	sub, err := watcher.SubscribeSync("capstan.progress.>")
	if err != nil {
		t.Fatal(err)
	}
	if err := watcher.Flush(); err != nil {
		t.Fatal(err)
	}
	var log progressLog
	for range 20 {
		e, err := c.Call(executor.WithProgress(ctxT(t), log.add), "demo.echo", echoIn{Hello: "x"})
		if err != nil || e.Status != envelope.StatusCompleted {
			t.Fatalf("%v %+v", err, e)
		}
		st, err := c.Status(ctxT(t), e.ExecutionID)
		if err != nil || st.Record == nil || st.Record.Progress != nil {
			t.Fatalf("record: %v %+v", err, st)
		}
	}
	// Whatever the worker published before its envelopes the server has
	// handed to the watcher before these flushes return.
	if err := workerNC.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := watcher.Flush(); err != nil {
		t.Fatal(err)
	}
	if n, _, _ := sub.Pending(); n != 0 {
		m, _ := sub.NextMsg(time.Millisecond)
		t.Fatalf("%d progress messages of handlers that never reported, the first on %s", n, m.Subject)
	}
	if got := log.all(); len(got) != 0 {
		t.Fatalf("callback got %+v", got)
	}
}

// Client.Progress follows one execution by id, a fan-out's callback gets
// each execution's reports, and an Await follows too.
func TestProgress_ChannelFanOutAndAwait(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	next := make(chan struct{})
	startWorker(t, env.Connect(t), executor.WorkerConfig{ID: "w", Concurrency: 4}, steppedReport(2, next))
	c := newClient(t, env.Connect(t))

	t.Run("channel", func(t *testing.T) {
		id := envelope.NewExecutionID()
		ctx, cancel := context.WithCancel(ctxT(t))
		ch, err := c.Progress(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Submit(ctxT(t), "test.report", nil, executor.WithID(id)); err != nil {
			t.Fatal(err)
		}
		for step := 1; step <= 2; step++ {
			select {
			case p := <-ch:
				if p.ExecutionID != id || p.Done != float64(step) || p.Total != 2 {
					t.Fatalf("step %d: %+v", step, p)
				}
			case <-ctxT(t).Done():
				t.Fatalf("no progress for step %d", step)
			}
			next <- struct{}{}
		}
		if e, err := c.Await(ctxT(t), id); err != nil || e.Status != envelope.StatusCompleted {
			t.Fatalf("%v %+v", err, e)
		}
		cancel()
		for range ch { // closed once ctx ended
		}
	})

	t.Run("fan-out", func(t *testing.T) {
		var log progressLog
		ids := []string{envelope.NewExecutionID(), envelope.NewExecutionID()}
		done := make(chan []error, 1)
		go func() {
			_, errs := c.CallMany(executor.WithProgress(ctxT(t), log.add), []executor.Request{
				{CapabilityID: "test.report", Options: []executor.CallOption{executor.WithID(ids[0])}},
				{CapabilityID: "test.report", Options: []executor.CallOption{executor.WithID(ids[1])}},
			})
			log.after.Store(true)
			done <- errs
		}()
		seen := func(id string, step float64) bool {
			for _, p := range log.all() {
				if p.ExecutionID == id && p.Done == step {
					return true
				}
			}
			return false
		}
		for step := 1.0; step <= 2; step++ {
			waitUntil(t, "each execution's progress", func() bool { return seen(ids[0], step) && seen(ids[1], step) })
			next <- struct{}{}
			next <- struct{}{}
		}
		for _, err := range <-done {
			if err != nil {
				t.Fatal(err)
			}
		}
		if n := log.late.Load(); n != 0 {
			t.Fatalf("%d reports after CallMany returned", n)
		}
	})

	t.Run("await", func(t *testing.T) {
		var log progressLog
		id, err := c.Submit(ctxT(t), "test.report", nil)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			_, err := c.Await(executor.WithProgress(ctxT(t), log.add), id)
			done <- err
		}()
		// The first report may have come before Await subscribed: the
		// second is made once the server knows of its subscription.
		waitInterest(t, env.Connect(t), testhooks.Broker(c).Names.ProgressSubject(broker.Anonymous, id))
		next <- struct{}{}
		waitUntil(t, "the second step's progress", func() bool { p := log.last(); return p != nil && p.Done == 2 })
		next <- struct{}{}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	})
}

// Progress of another execution, or a record that does not decode, never
// reaches a caller following one execution.
func TestProgress_OnlyTheFollowedExecutionsReports(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	nc := env.Connect(t)
	c := newClient(t, nc)
	id, other := envelope.NewExecutionID(), envelope.NewExecutionID()
	ch, err := c.Progress(ctxT(t), id)
	if err != nil {
		t.Fatal(err)
	}
	n := testhooks.Broker(c).Names
	publish := func(subject string, p envelope.Progress) {
		b, err := envelope.Marshal(&p)
		if err != nil {
			t.Fatal(err)
		}
		if err := nc.Publish(subject, b); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now().UTC()
	// Another execution's report on this one's subject, garbage, another
	// schema version, then the real one.
	publish(n.ProgressSubject(broker.Anonymous, id), envelope.Progress{V: 1, ExecutionID: other, Done: 9, At: now})
	if err := nc.Publish(n.ProgressSubject(broker.Anonymous, id), []byte("not msgpack")); err != nil {
		t.Fatal(err)
	}
	publish(n.ProgressSubject(broker.Anonymous, id), envelope.Progress{V: 2, ExecutionID: id, Done: 8, At: now})
	publish(n.ProgressSubject(broker.Anonymous, other), envelope.Progress{V: 1, ExecutionID: other, Done: 7, At: now})
	publish(n.ProgressSubject(broker.Anonymous, id), envelope.Progress{V: 1, ExecutionID: id, Done: 1, At: now})
	select {
	case p := <-ch:
		if p.ExecutionID != id || p.Done != 1 {
			t.Fatalf("got %+v", p)
		}
	case <-ctxT(t).Done():
		t.Fatal("no progress")
	}
	// The reports before it were handled before it, in order.
	select {
	case p := <-ch:
		t.Fatalf("a second report: %+v", p)
	default:
	}
}

// waitInterest waits until the server knows of a subscription to subject:
// a request to it is then no longer answered "no responders" at once.
func waitInterest(t *testing.T, nc *nats.Conn, subject string) {
	t.Helper()
	waitUntil(t, "a subscription to "+subject, func() bool {
		_, err := nc.Request(subject, nil, 20*time.Millisecond)
		return !errors.Is(err, nats.ErrNoResponders)
	})
}
