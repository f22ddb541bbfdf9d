package telemetry_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/internal/testhooks"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/capstan-dev/capstan/telemetry"
)

// A known workload through a real worker on embedded JetStream: the scrape
// counts exactly what happened, per capability, pool, status and code.
func TestMetrics_ScrapeCountsAKnownWorkload(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	nc := env.Connect(t)
	ctx := ctxT(t)
	tel := telemetry.New(telemetry.Options{})
	b, err := broker.Provision(ctx, nc, broker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	tel.Watch(b.NC, b.Config.Prefix, time.Nanosecond)

	stop := runWorker(t, nc, executor.WorkerConfig{Pool: "obs", Observer: tel.Worker()}, capabilities(nil)[:4]...)
	c := newClient(t, nc, executor.ClientConfig{Observer: tel.Client()})
	want := map[string]envelope.Status{}
	call := func(capID string, input any, status envelope.Status) {
		t.Helper()
		e, err := c.Call(ctx, capID, input)
		if err != nil {
			t.Fatal(err)
		}
		if e.Status != status {
			t.Fatalf("%s: %s %+v, want %s", capID, e.Status, e.Error, status)
		}
		want[e.ExecutionID] = status
	}
	for range 3 {
		call("t.echo", echoIn{Hello: "x"}, envelope.StatusCompleted)
	}
	call("t.flaky", flakyIn{FailTimes: 1}, envelope.StatusCompleted)
	call("t.fail", echoIn{}, envelope.StatusFailed)
	call("t.approve", echoIn{Hello: "please"}, envelope.StatusApprovalRequired)
	call("t.nobody", echoIn{}, envelope.StatusFailed)

	// A pool no worker serves yet: two requests wait in its queue.
	if _, err := b.EnsurePool(ctx, broker.PoolConfig{Pool: "idle", Capabilities: []string{"t.idle"}}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		publishRaw(t, b, "t.idle")
	}
	// Every delivery the worker took has ended once it stopped.
	stop()

	m := scrape(t, tel.Handler())
	counts := []struct {
		name   string
		labels []string
		want   float64
	}{
		{"capstan_executions_finalized_total", []string{"capability=t.echo", "pool=obs", "status=completed", "code="}, 3},
		{"capstan_executions_finalized_total", []string{"capability=t.flaky", "pool=obs", "status=completed", "code="}, 1},
		{"capstan_executions_finalized_total", []string{"capability=t.fail", "pool=obs", "status=failed", "code=EXECUTION_FAILED"}, 1},
		{"capstan_executions_finalized_total", []string{"capability=t.approve", "pool=obs", "status=approval-required", "code="}, 1},
		{"capstan_executions_finalized_total", []string{"capability=_unknown", "pool=obs", "status=failed", "code=CAPABILITY_NOT_FOUND"}, 1},
		{"capstan_attempts_total", []string{"capability=t.echo", "pool=obs"}, 3},
		{"capstan_attempts_total", []string{"capability=t.flaky", "pool=obs"}, 2},
		{"capstan_attempts_total", []string{"capability=t.fail", "pool=obs"}, 1},
		{"capstan_retries_total", []string{"capability=t.flaky", "pool=obs", "previous_code=EXECUTION_FAILED"}, 1},
		{"capstan_handler_duration_seconds", []string{"capability=t.echo", "pool=obs"}, 3},
		{"capstan_handler_duration_seconds", []string{"capability=t.flaky", "pool=obs"}, 2},
		{"capstan_execution_duration_seconds", []string{"capability=t.echo", "pool=obs", "status=completed"}, 3},
		{"capstan_queue_wait_seconds", []string{"capability=t.echo", "pool=obs"}, 3},
		{"capstan_executions_in_flight", []string{"capability=t.echo", "pool=obs"}, 0},
		{"capstan_client_requests_total", []string{"capability=t.echo", "outcome=completed"}, 3},
		{"capstan_client_requests_total", []string{"capability=t.fail", "outcome=failed"}, 1},
		{"capstan_client_requests_total", []string{"capability=t.approve", "outcome=approval-required"}, 1},
		{"capstan_client_call_duration_seconds", []string{"capability=t.echo", "status=completed"}, 3},
		{"capstan_approvals_pending", []string{"capability=t.approve"}, 1},
		{"capstan_pool_pending_requests", []string{"pool=idle"}, 2},
		{"capstan_pool_pending_requests", []string{"pool=obs"}, 0},
		{"capstan_pool_unacknowledged_requests", []string{"pool=obs"}, 0},
		{"capstan_pool_oldest_request_age_seconds", []string{"pool=obs"}, 0},
		{"capstan_audit_publish_failures_total", nil, 0},
	}
	for _, c := range counts {
		got, ok := value(m, c.name, c.labels...)
		if !ok || got != c.want {
			t.Errorf("%s%v = %v (present %v), want %v", c.name, c.labels, got, ok, c.want)
		}
	}
	if got := sum(m, "capstan_executions_finalized_total"); got != float64(len(want)) {
		t.Errorf("%v executions finalized in all, want %d", got, len(want))
	}
	if got := sum(m, "capstan_takeovers_total") + sum(m, "capstan_outcome_unknown_total"); got != 0 {
		t.Errorf("%v takeovers and unknown outcomes, want none", got)
	}
	if age, ok := value(m, "capstan_pool_oldest_request_age_seconds", "pool=idle"); !ok || age <= 0 {
		t.Errorf("oldest request of the idle pool %v s (present %v): want its age", age, ok)
	}
}

// A worker lost during an attempt that may not be repeated: its successor
// takes the execution over and finalizes OUTCOME_UNKNOWN, which the scrape
// shows as a takeover from "running" and one unknown outcome.
func TestMetrics_TakeoverAndOutcomeUnknownCounted(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	nc := env.Connect(t)
	ctx := ctxT(t)
	tel := telemetry.New(telemetry.Options{})
	holding := make(chan struct{}, 1)
	hold := capabilities(holding)[4]

	lease := 2 * time.Second
	leaving := runWorker(t, env.Connect(t), executor.WorkerConfig{Pool: "obs", ID: "leaving", Lease: lease,
		Grace: 50 * time.Millisecond, Observer: tel.Worker()}, hold)
	c := newClient(t, nc, executor.ClientConfig{Observer: tel.Client()})
	id, err := c.Submit(ctx, "t.hold", echoIn{})
	if err != nil {
		t.Fatal(err)
	}
	<-holding
	leaving() // gives the lease back: the execution is left running{1}
	staying := runWorker(t, env.Connect(t), executor.WorkerConfig{Pool: "obs", ID: "staying", Lease: lease, Observer: tel.Worker()}, hold)
	e, err := c.Await(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if e.Status != envelope.StatusFailed || e.Error.Code != envelope.CodeOutcomeUnknown {
		t.Fatalf("envelope %s %+v, want failed OUTCOME_UNKNOWN", e.Status, e.Error)
	}
	staying() // its deliveries have ended: the counts are final

	m := scrape(t, tel.Handler())
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"capstan_takeovers_total", []string{"capability=t.hold", "pool=obs", "from_state=running"}, 1},
		{"capstan_outcome_unknown_total", []string{"capability=t.hold", "pool=obs"}, 1},
		{"capstan_executions_finalized_total", []string{"capability=t.hold", "pool=obs", "status=failed", "code=OUTCOME_UNKNOWN"}, 1},
		{"capstan_attempts_total", []string{"capability=t.hold", "pool=obs"}, 1},
		{"capstan_client_requests_total", []string{"capability=t.hold", "outcome=submitted"}, 1},
	} {
		got, ok := value(m, c.name, c.labels...)
		if !ok || got != c.want {
			t.Errorf("%s%v = %v (present %v), want %v", c.name, c.labels, got, ok, c.want)
		}
	}
}

// publishRaw stores a request for capID straight on its subject, as a
// producer whose catalog lists it would.
func publishRaw(t *testing.T, b *broker.Broker, capID string) {
	t.Helper()
	id := envelope.NewExecutionID()
	data, err := envelope.Marshal(&envelope.Request{V: envelope.Version, ExecutionID: id, CapabilityID: capID,
		Actor: alice, Surface: "direct", SubmittedAt: time.Now().UTC()})
	if err != nil {
		t.Fatal(err)
	}
	m := nats.NewMsg(b.Names.ExecSubject(broker.Anonymous, capID))
	m.Data = data
	if _, err := b.JS.PublishMsg(ctxT(t), m, jetstream.WithMsgID(id)); err != nil {
		t.Fatal(err)
	}
}

// Every envelope a worker creates is counted, those of requests it refuses
// before any claim too: one past its start deadline (NOT_STARTED) and one
// that does not decode (INPUT_INVALID).
func TestMetrics_EnvelopesOfRequestsRefusedBeforeAClaimCounted(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	nc := env.Connect(t)
	ctx := ctxT(t)
	tel := telemetry.New(telemetry.Options{})
	var logs syncBuffer
	stop := runWorker(t, nc, executor.WorkerConfig{Pool: "obs", Observer: tel.Worker(),
		Logger: slog.New(slog.NewTextHandler(&logs, nil))}, capabilities(nil)[0])
	c := newClient(t, nc, executor.ClientConfig{})
	b := testhooks.Broker(c)

	late := envelope.NewExecutionID()
	startBy := time.Now().UTC().Add(-time.Minute)
	data, err := envelope.Marshal(&envelope.Request{V: envelope.Version, ExecutionID: late, CapabilityID: "t.echo",
		Actor: alice, Surface: "direct", SubmittedAt: time.Now().UTC(), StartBy: &startBy})
	if err != nil {
		t.Fatal(err)
	}
	garbled := envelope.NewExecutionID()
	for id, body := range map[string][]byte{late: data, garbled: []byte("not a request")} {
		m := nats.NewMsg(b.Names.ExecSubject(broker.Anonymous, "t.echo"))
		m.Data = body
		if _, err := b.JS.PublishMsg(ctx, m, jetstream.WithMsgID(id)); err != nil {
			t.Fatal(err)
		}
	}
	for id, code := range map[string]envelope.Code{late: envelope.CodeNotStarted, garbled: envelope.CodeInputInvalid} {
		e, err := c.Await(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if e.Error == nil || e.Error.Code != code {
			t.Fatalf("envelope %s %+v, want %s", e.Status, e.Error, code)
		}
	}
	stop() // every delivery it took has ended: the counts are final

	m := scrape(t, tel.Handler())
	for _, code := range []string{"NOT_STARTED", "INPUT_INVALID"} {
		got, ok := value(m, "capstan_executions_finalized_total", "capability=t.echo", "pool=obs", "status=failed", "code="+code)
		if !ok || got != 1 {
			t.Errorf("finalized %s: %v (present %v), want 1", code, got, ok)
		}
	}
	if got := sum(m, "capstan_executions_finalized_total"); got != 2 {
		t.Errorf("%v executions finalized in all, want 2", got)
	}
	if got := sum(m, "capstan_executions_in_flight"); got != 0 {
		t.Errorf("%v executions in flight after the worker stopped", got)
	}
	// And each has its one log line, as every envelope a worker writes.
	for _, id := range []string{late, garbled} {
		n := 0
		for _, line := range strings.Split(logs.String(), "\n") {
			if strings.Contains(line, `msg="execution finalized"`) && strings.Contains(line, " executionId="+id+" ") {
				n++
			}
		}
		if n != 1 {
			t.Errorf("%d execution finalized lines for %s:\n%s", n, id, logs.String())
		}
	}
}

// syncBuffer is a bytes.Buffer a worker's goroutines may log to.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// A request's submission time is the client's to write: the queue wait and
// the execution's duration are measured from when JetStream stored it, so
// that a client's clock, or a client lying, does not move them; for a request
// that runs and for one refused past its start deadline alike.
func TestMetrics_QueueWaitFromTheServersClockNotTheClients(t *testing.T) {
	t.Parallel()
	began := time.Now()
	env := testenv.Start(t)
	nc := env.Connect(t)
	ctx := ctxT(t)
	tel := telemetry.New(telemetry.Options{})
	stop := runWorker(t, nc, executor.WorkerConfig{Pool: "obs", Observer: tel.Worker()}, capabilities(nil)[0])
	c := newClient(t, nc, executor.ClientConfig{})
	b := testhooks.Broker(c)

	past := time.Now().UTC().Add(-time.Minute)
	for _, startBy := range []*time.Time{nil, &past} {
		id := envelope.NewExecutionID()
		data, err := envelope.Marshal(&envelope.Request{V: envelope.Version, ExecutionID: id, CapabilityID: "t.echo",
			Input: envelope.MustRaw(echoIn{}), Actor: alice, Surface: "direct",
			SubmittedAt: time.Now().UTC().Add(-1000 * time.Hour), StartBy: startBy})
		if err != nil {
			t.Fatal(err)
		}
		m := nats.NewMsg(b.Names.ExecSubject(broker.Anonymous, "t.echo"))
		m.Data = data
		if _, err := b.JS.PublishMsg(ctx, m, jetstream.WithMsgID(id)); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Await(ctx, id); err != nil {
			t.Fatalf("await: %v", err)
		}
	}
	stop() // every delivery it took has ended: the counts are final
	elapsed := time.Since(began).Seconds()

	fams := scrape(t, tel.Handler())
	for _, name := range []string{"capstan_queue_wait_seconds", "capstan_execution_duration_seconds"} {
		var n uint64
		var s float64
		for _, m := range fams[name].GetMetric() {
			n += m.GetHistogram().GetSampleCount()
			s += m.GetHistogram().GetSampleSum()
		}
		if n != 2 || s < 0 || s > elapsed {
			t.Errorf("%s: %d observations summing to %v s, want two within the test's %v s", name, n, s, elapsed)
		}
	}
}

// A worker lost after its handler recorded a receipt: its successor takes the
// execution over and finalizes it completed from the receipt, which the scrape
// shows as one execution recovered by receipt, and no unknown outcome.
func TestMetrics_RecoveredCountedByHow(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	nc := env.Connect(t)
	ctx := ctxT(t)
	tel := telemetry.New(telemetry.Options{})
	holding := make(chan struct{}, 1)
	send := executor.Define("t.send", executor.Meta{Description: "Records a receipt, then holds until its context ends.",
		Expose: executor.On(executor.SurfaceDirect), SideEffect: executor.SideEffectExternal},
		func(ctx context.Context, c executor.Call[echoIn]) (echoIn, error) {
			if err := c.Receipt(ctx, echoIn{Hello: "sent"}); err != nil {
				return echoIn{}, err
			}
			holding <- struct{}{}
			<-ctx.Done()
			return echoIn{}, ctx.Err()
		})

	lease := 2 * time.Second
	leaving := runWorker(t, env.Connect(t), executor.WorkerConfig{Pool: "obs", ID: "leaving", Lease: lease,
		Grace: 50 * time.Millisecond, Observer: tel.Worker()}, send)
	c := newClient(t, nc, executor.ClientConfig{Observer: tel.Client()})
	id, err := c.Submit(ctx, "t.send", echoIn{})
	if err != nil {
		t.Fatal(err)
	}
	<-holding
	leaving() // gives the lease back: the execution is left running{1}, its receipt recorded
	staying := runWorker(t, env.Connect(t), executor.WorkerConfig{Pool: "obs", ID: "staying", Lease: lease, Observer: tel.Worker()}, send)
	e, err := c.Await(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if e.Status != envelope.StatusCompleted || e.Recovered == nil || e.Recovered.How != envelope.RecoveredByReceipt {
		t.Fatalf("envelope %s %+v recovered %+v, want completed from the receipt", e.Status, e.Error, e.Recovered)
	}
	staying()

	m := scrape(t, tel.Handler())
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"capstan_executions_recovered_total", []string{"capability=t.send", "pool=obs", "how=receipt"}, 1},
		{"capstan_takeovers_total", []string{"capability=t.send", "pool=obs", "from_state=running"}, 1},
		{"capstan_executions_finalized_total", []string{"capability=t.send", "pool=obs", "status=completed", "code="}, 1},
	} {
		got, ok := value(m, c.name, c.labels...)
		if !ok || got != c.want {
			t.Errorf("%s%v = %v (present %v), want %v", c.name, c.labels, got, ok, c.want)
		}
	}
	if got := sum(m, "capstan_outcome_unknown_total"); got != 0 {
		t.Errorf("%v unknown outcomes, want none", got)
	}
}
