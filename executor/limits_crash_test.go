package executor_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/capstan-dev/capstan/internal/testhooks"
	"github.com/capstan-dev/capstan/observe"
)

// Environment of a limits worker process started by running this test
// binary again.
const (
	limitsProcessURL   = "CAPSTAN_TEST_LIMITS_WORKER_URL"
	limitsProcessID    = "CAPSTAN_TEST_LIMITS_WORKER_ID"
	limitsProcessLease = "CAPSTAN_TEST_LIMITS_WORKER_LEASE"
	limitsProcessSweep = "CAPSTAN_TEST_LIMITS_WORKER_SWEEP"
	// limitsProcessStall: the process stops each execution once its
	// limits are taken, before its attempt starts, and says so.
	limitsProcessStall = "CAPSTAN_TEST_LIMITS_WORKER_STALL"
	slotEffects        = "LIMITS_EFFECTS"
	// limitsProcessStallWait: the process stops an execution a limit held
	// back once its record is created, before it is given back, and says so.
	limitsProcessStallWait = "CAPSTAN_TEST_LIMITS_WORKER_STALL_WAIT"
)

// stallAtWait is a worker observer whose executions stop, once a limit held
// them back, right after their record is created.
type stallAtWait struct {
	observe.NopWorker
	js jetstream.JetStream
}

func (s stallAtWait) Begin(ctx context.Context, d observe.Delivery) (context.Context, observe.Execution) {
	return ctx, &stallingExecution{js: s.js, id: d.Request.ExecutionID}
}

type stallingExecution struct {
	observe.NopExecution
	js      jetstream.JetStream
	id      string
	limited bool
}

func (e *stallingExecution) Limited(string, string) { e.limited = true }

func (e *stallingExecution) Stage(ctx context.Context, name string) (context.Context, func(error)) {
	return ctx, func(err error) {
		if name == observe.StageClaim && e.limited && err == nil {
			_, _ = e.js.Publish(context.Background(), "limits.stalled."+e.id, nil)
			select {} // until killed
		}
	}
}

// killRig is the embedded server of a test that kills worker processes,
// with the stream where their handlers store what they did, and a client;
// it skips the test with -short.
func killRig(t *testing.T) (*testenv.Env, jetstream.JetStream, *executor.Client) {
	t.Helper()
	if testing.Short() {
		t.Skip("kills worker processes")
	}
	env := testenv.Start(t)
	js := env.JetStream(t)
	if _, err := js.CreateStream(ctxT(t), jetstream.StreamConfig{Name: slotEffects, Subjects: []string{"limits.>"}}); err != nil {
		t.Fatal(err)
	}
	return env, js, newClient(t, env.Connect(t))
}

// sigkill kills a worker process and waits for its end.
func sigkill(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
}

type slotIn struct {
	Hold bool `json:"hold,omitempty"`
}

// slotCapability may run once at a time across the deployment.
func slotCapability(js jetstream.JetStream) executor.Capability {
	return executor.Define("t.slot", executor.Meta{Description: "Runs alone.", Expose: executor.On(executor.SurfaceDirect),
		SideEffect: executor.SideEffectWrite, Limits: []executor.Limit{{Kind: executor.LimitConcurrency, Max: 1}}},
		startRecorded(js))
}

// actorCapability may run twice at once for each actor.
func actorCapability(js jetstream.JetStream) executor.Capability {
	return executor.Define("t.actor", executor.Meta{Description: "Runs twice at a time per actor.", Expose: executor.On(executor.SurfaceDirect),
		SideEffect: executor.SideEffectWrite, Limits: []executor.Limit{{Kind: executor.LimitConcurrency, Per: executor.LimitPerActor, Max: 2}}},
		startRecorded(js))
}

// ratedCapability may start once an hour for each actor, and refuses the
// calls over that.
func ratedCapability(js jetstream.JetStream) executor.Capability {
	return executor.Define("t.rated", executor.Meta{Description: "Runs once an hour per actor.", Expose: executor.On(executor.SurfaceDirect),
		SideEffect: executor.SideEffectWrite, Limits: []executor.Limit{{Kind: executor.LimitRate, Per: executor.LimitPerActor,
			Max: 1, Interval: time.Hour, AtLimit: executor.AtLimitRefuse}}},
		startRecorded(js))
}

// startRecorded is the handler of the limits' crash tests: each call records
// its start in a stream that outlives every process, then holds until
// cancelled when asked to.
func startRecorded(js jetstream.JetStream) executor.Handler[slotIn, string] {
	return func(ctx context.Context, call executor.Call[slotIn]) (string, error) {
		if _, err := js.Publish(ctx, "limits.effects."+call.ExecutionID, []byte("start")); err != nil {
			return "", err
		}
		if call.Input.Hold {
			<-ctx.Done()
			return "", ctx.Err()
		}
		return "ran", nil
	}
}

// pairCapability may run twice at once across the deployment, a read the
// runtime retries after a lost worker; each call records its start and its
// end, with the worker's id, in a stream that outlives every process.
func pairCapability(js jetstream.JetStream, worker string) executor.Capability {
	return executor.Define("t.pair", executor.Meta{Description: "Runs two at a time.", Expose: executor.On(executor.SurfaceDirect),
		SideEffect: executor.SideEffectRead, Retry: &executor.Retry{MaxAttempts: 5, Backoff: 10 * time.Millisecond},
		Limits: []executor.Limit{{Kind: executor.LimitConcurrency, Max: 2}}},
		func(ctx context.Context, call executor.Call[struct{}]) (string, error) {
			if _, err := js.Publish(ctx, "limits.pair", []byte("start "+worker)); err != nil {
				return "", err
			}
			time.Sleep(20 * time.Millisecond)
			if _, err := js.Publish(ctx, "limits.pair", []byte("end "+worker)); err != nil {
				return "", err
			}
			return "ran", nil
		})
}

// TestLimitsWorkerProcess is no test of its own: it is the worker process
// that TestLimits_KilledWorkersSlotIsFreedByItsLease starts, and kills.
func TestLimitsWorkerProcess(t *testing.T) {
	url := os.Getenv(limitsProcessURL)
	if url == "" {
		t.Skip("runs only as a worker process of another test")
	}
	nc, err := nats.Connect(url, nats.Name(os.Getenv(limitsProcessID)), nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	reg, err := executor.NewRegistry(slotCapability(js), pairCapability(js, os.Getenv(limitsProcessID)), actorCapability(js),
		ratedCapability(js))
	if err != nil {
		t.Fatal(err)
	}
	lease, _ := time.ParseDuration(os.Getenv(limitsProcessLease))
	sweep, _ := time.ParseDuration(os.Getenv(limitsProcessSweep))
	cfg := executor.WorkerConfig{ID: os.Getenv(limitsProcessID), Lease: lease, Grace: time.Second, SweepInterval: sweep}
	if os.Getenv(limitsProcessStall) != "" {
		cfg = testhooks.Worker(cfg, testhooks.WorkerKnobs{BeforeAttempt: func(id string, _ int) {
			_, _ = js.Publish(context.Background(), "limits.stalled."+id, nil)
			select {} // until killed
		}})
	}
	if os.Getenv(limitsProcessStallWait) != "" {
		cfg.Observer = stallAtWait{js: js}
	}
	w, err := executor.NewWorker(nc, reg, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := w.Run(ctx); err != nil {
		t.Fatal(err)
	}
}

// slotHolders reads the claims holding t.slot's slots.
func slotHolders(t *testing.T, js jetstream.JetStream) []string {
	t.Helper()
	kv, err := js.KeyValue(ctxT(t), "CAPSTAN_LIMITS")
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(ctxT(t), "c.t.slot")
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		Holders []struct {
			Key   string `json:"key"`
			Claim string `json:"claim"`
		} `json:"holders"`
	}
	if err := envelope.Unmarshal(e.Value(), &c); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, h := range c.Holders {
		keys = append(keys, h.Key)
	}
	return keys
}

func slotStarts(t *testing.T, js jetstream.JetStream, id string) uint64 {
	t.Helper()
	s, err := js.Stream(ctxT(t), slotEffects)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctxT(t), jetstream.WithSubjectFilter("limits.effects."+id))
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Subjects["limits.effects."+id]
}

// A worker process SIGKILLed while it holds the only slot: the slot is not
// leaked (a new call runs once the dead worker's lease has lapsed, judged by
// its execution's record, never on a guess) and not counted twice (the
// killed execution, a write, is never run again: OUTCOME_UNKNOWN), and in
// the end no slot is held.
func TestLimits_KilledWorkersSlotIsFreedByItsLease(t *testing.T) {
	t.Parallel()
	const lease = 2 * time.Second
	env, js, c := killRig(t)
	victim := limitsProcess(t, env, "limits-victim", lease)

	held, err := c.Submit(ctxT(t), "t.slot", slotIn{Hold: true})
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the held call's start", func() bool { return slotStarts(t, js, held) == 1 })
	sigkill(t, victim)
	if h := slotHolders(t, js); len(h) != 1 {
		t.Fatalf("the dead worker's slot: holders %v", h)
	}

	startWorker(t, env.Connect(t), executor.WorkerConfig{Lease: lease}, slotCapability(js))
	next, err := c.Call(ctxT(t), "t.slot", slotIn{})
	if err != nil || next.Status != envelope.StatusCompleted {
		t.Fatalf("a call after the kill: %v %+v", err, next)
	}
	got, err := c.Await(ctxT(t), held)
	if err != nil || got.Status != envelope.StatusFailed || got.Error == nil || got.Error.Code != envelope.CodeOutcomeUnknown {
		t.Fatalf("the killed call: %v %+v", err, got)
	}
	if n := slotStarts(t, js, held); n != 1 {
		t.Errorf("the killed call's handler ran %d times", n)
	}
	waitUntil(t, "every slot given back", func() bool { return len(slotHolders(t, js)) == 0 })
}

// A worker process SIGKILLed while it holds one of an actor's two slots, an
// actor who never calls again: the slot is not kept for ever (the bucket
// would grow with every kill and every actor in flight). The worker that
// sweeps finds its holder gone by its record and frees it, though the
// execution's takeover, taking the actor's other slot, never had to ask.
func TestLimits_KilledWorkersSlotIsFreedThoughItsActorNeverReturns(t *testing.T) {
	t.Parallel()
	const lease = 2 * time.Second
	env, js, c := killRig(t)
	// The victim never sweeps: the duty is the survivor's from the start.
	victim := limitsProcess(t, env, "actor-victim", lease, limitsProcessSweep+"=-1s")

	held, err := c.Submit(ctxT(t), "t.actor", slotIn{Hold: true})
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the held call's start", func() bool { return slotStarts(t, js, held) == 1 })
	sigkill(t, victim)
	if h := actorHolders(t, js); len(h) != 1 {
		t.Fatalf("the dead worker's slot: holders %v", h)
	}

	startWorker(t, env.Connect(t), executor.WorkerConfig{Lease: lease, SweepInterval: 100 * time.Millisecond}, actorCapability(js))
	got, err := c.Await(ctxT(t), held)
	if err != nil || got.Status != envelope.StatusFailed || got.Error == nil || got.Error.Code != envelope.CodeOutcomeUnknown {
		t.Fatalf("the killed call: %v %+v", err, got)
	}
	waitUntil(t, "the dead worker's slot freed", func() bool { return len(actorHolders(t, js)) == 0 })
}

// A worker process SIGKILLed once an execution took its rate, before its
// attempt started: the execution's redelivery runs it, counted once. A rate
// of one an hour that counted it twice refused it RATE_LIMITED, a call
// that never ran, over its own first taking.
func TestLimits_KilledBeforeItsAttemptAnExecutionTakesItsRateOnce(t *testing.T) {
	t.Parallel()
	const lease = 2 * time.Second
	env, js, c := killRig(t)
	victim := limitsProcess(t, env, "rated-victim", lease, limitsProcessStall+"=1")

	id, err := c.Submit(ctxT(t), "t.rated", struct{}{})
	if err != nil {
		t.Fatal(err)
	}
	stalled := func() bool {
		info, err := mustStream(t, js).Info(ctxT(t), jetstream.WithSubjectFilter("limits.stalled."+id))
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Subjects["limits.stalled."+id] == 1
	}
	waitUntil(t, "the rate taken, the attempt not started", stalled)
	sigkill(t, victim)

	startWorker(t, env.Connect(t), executor.WorkerConfig{Lease: lease}, ratedCapability(js))
	got, err := c.Await(ctxT(t), id)
	if err != nil || got.Status != envelope.StatusCompleted {
		t.Fatalf("the execution whose worker was killed before its attempt: %v %+v (%+v), want it run", err, got, got.Error)
	}
	if n := slotStarts(t, js, id); n != 1 {
		t.Errorf("its handler ran %d times", n)
	}
}

// actorHolders reads the claims holding the actor's slots of t.actor (one
// actor calls it).
func actorHolders(t *testing.T, js jetstream.JetStream) []string {
	t.Helper()
	kv, err := js.KeyValue(ctxT(t), "CAPSTAN_LIMITS")
	if err != nil {
		t.Fatal(err)
	}
	keys, err := kv.ListKeysFiltered(ctxT(t), "s.a.*.t.actor")
	if err != nil {
		t.Fatal(err)
	}
	var claims []string
	n := 0
	for key := range keys.Keys() {
		n++
		e, err := kv.Get(ctxT(t), key)
		if err != nil {
			t.Fatal(err)
		}
		var c struct {
			Holders []struct {
				Claim string `json:"claim"`
			} `json:"holders"`
		}
		if err := envelope.Unmarshal(e.Value(), &c); err != nil {
			t.Fatal(err)
		}
		for _, h := range c.Holders {
			claims = append(claims, h.Claim)
		}
	}
	if n != 1 {
		t.Fatalf("%d counters of the actor's slots, want 1", n)
	}
	return claims
}

// limitsProcess starts a limits worker process on e and returns once it
// serves; it is killed when the test ends. Its output goes to the test log;
// a race it reports fails the test.
func limitsProcess(t *testing.T, e *testenv.Env, id string, lease time.Duration, env ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestLimitsWorkerProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), limitsProcessURL+"="+e.URL, limitsProcessID+"="+id, limitsProcessLease+"="+lease.String())
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	races := 0
	read := make(chan struct{})
	go func() {
		defer close(read)
		s := bufio.NewScanner(out)
		for s.Scan() {
			if line := s.Text(); strings.Contains(line, "WARNING: DATA RACE") {
				races++
			}
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-read
		_ = cmd.Wait()
		if races > 0 {
			t.Errorf("worker process %s reported %d data races", id, races)
		}
	})
	waitProcessesServing(t, e.Server, id)
	return cmd
}

// Three worker processes serve a capability that may run twice at once;
// 64 callers call it three times each while workers are SIGKILLed and
// replaced. Every call completes, and the handler calls, read in the order
// the server stored their starts and ends (a killed worker's calls end
// where the test recorded its death), never run three at once.
func TestLimits_ConcurrencyHoldsWhileWorkersAreKilled(t *testing.T) {
	t.Parallel()
	const lease = 2 * time.Second
	env, js, c := killRig(t)
	workers := map[string]*exec.Cmd{}
	next := 0
	spawn := func() {
		id := fmt.Sprintf("pair-%d", next)
		next++
		workers[id] = limitsProcess(t, env, id, lease)
	}
	for range 3 {
		spawn()
	}
	reqs := make([]executor.Request, 64*3)
	for i := range reqs {
		reqs[i] = executor.Request{CapabilityID: "t.pair", Input: struct{}{}}
	}
	type result struct {
		envs []*envelope.Envelope
		errs []error
	}
	done := make(chan result, 1)
	go func() {
		// 64 callers, each with three calls.
		envs, errs := make([]*envelope.Envelope, len(reqs)), make([]error, len(reqs))
		var wg sync.WaitGroup
		for caller := range 64 {
			wg.Go(func() {
				for k := range 3 {
					i := caller*3 + k
					envs[i], errs[i] = c.Call(context.Background(), "t.pair", struct{}{})
				}
			})
		}
		wg.Wait()
		done <- result{envs, errs}
	}()
	pairs := func() uint64 {
		info, err := mustStream(t, js).Info(ctxT(t), jetstream.WithSubjectFilter("limits.pair"))
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Subjects["limits.pair"]
	}
	for kill := range 2 {
		waitUntil(t, "handler calls before a kill", func() bool { return pairs() >= uint64(40*(kill+1)) })
		var victim string
		for id := range workers {
			victim = id
			break
		}
		sigkill(t, workers[victim])
		delete(workers, victim)
		if _, err := js.Publish(ctxT(t), "limits.pair", []byte("killed "+victim)); err != nil {
			t.Fatal(err)
		}
		spawn()
	}
	var res result
	select {
	case res = <-done:
	case <-time.After(3 * time.Minute):
		t.Fatal("the calls never all ended")
	}
	for i := range res.envs {
		if res.errs[i] != nil || res.envs[i].Status != envelope.StatusCompleted {
			t.Fatalf("call %d: %v %+v", i, res.errs[i], res.envs[i])
		}
	}
	// Replay the starts and ends in the server's order.
	running := map[string]int{}
	most, total, starts := 0, 0, 0
	cons, err := mustStream(t, js).OrderedConsumer(ctxT(t), jetstream.OrderedConsumerConfig{FilterSubjects: []string{"limits.pair"}})
	if err != nil {
		t.Fatal(err)
	}
	n := pairs()
	for range n {
		m, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
		if err != nil {
			t.Fatal(err)
		}
		what, worker, _ := strings.Cut(string(m.Data()), " ")
		switch what {
		case "start":
			running[worker]++
			starts++
		case "end":
			running[worker]--
		case "killed":
			running[worker] = 0
		}
		total = 0
		for _, r := range running {
			total += r
		}
		most = max(most, total)
	}
	t.Logf("%d calls, %d handler starts (attempts lost with a killed worker run again), at most %d at once", len(reqs), starts, most)
	if most > 2 {
		t.Errorf("%d handler calls ran at once, limit 2", most)
	}
	if most < 2 {
		t.Errorf("never two at once (%d): the test proves nothing", most)
	}
	waitUntil(t, "every slot given back", func() bool { return len(pairHolders(t, js)) == 0 })
}

func mustStream(t *testing.T, js jetstream.JetStream) jetstream.Stream {
	t.Helper()
	s, err := js.Stream(ctxT(t), slotEffects)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// pairHolders reads the keys holding t.pair's slots.
func pairHolders(t *testing.T, js jetstream.JetStream) []string {
	t.Helper()
	kv, err := js.KeyValue(ctxT(t), "CAPSTAN_LIMITS")
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(ctxT(t), "c.t.pair")
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		Holders []struct {
			Key string `json:"key"`
		} `json:"holders"`
	}
	if err := envelope.Unmarshal(e.Value(), &c); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, h := range c.Holders {
		keys = append(keys, h.Key)
	}
	return keys
}

// A worker process SIGKILLed while a call waits for the slot, between the
// record its first delivery creates and its give-back: the record's lease
// runs out, and another worker takes the call over from its claim and runs
// it, once. What the lost worker still held of its trail (the request and
// the limit) went with it, as an attempt's held start does (DESIGN §14):
// the trail tells the takeover of a claim in which no attempt had started.
func TestLimits_KilledAsItGivesAWaitingCallBackTheCallRunsOnce(t *testing.T) {
	t.Parallel()
	const lease = 2 * time.Second
	env, js, c := killRig(t)
	victim := limitsProcess(t, env, "wait-victim", lease, limitsProcessStallWait+"=1")
	ctx := ctxT(t)
	held, err := c.Submit(ctx, "t.slot", slotIn{Hold: true})
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the held call runs", func() bool { return slotStarts(t, js, held) == 1 })
	id, err := c.Submit(ctx, "t.slot", slotIn{})
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the waiting call's record created", func() bool {
		info, err := mustStream(t, js).Info(ctxT(t), jetstream.WithSubjectFilter("limits.stalled."+id))
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Subjects["limits.stalled."+id] == 1
	})
	if _, err := c.Cancel(ctx, held); err != nil {
		t.Fatal(err)
	}
	if got, err := c.Await(ctx, held); err != nil || got.Error == nil || got.Error.Code != envelope.CodeCancelled {
		t.Fatalf("the held call: %v %+v", err, got)
	}
	sigkill(t, victim)

	startWorker(t, env.Connect(t), executor.WorkerConfig{Lease: lease}, slotCapability(js))
	if got, err := c.Await(ctx, id); err != nil || got.Status != envelope.StatusCompleted {
		t.Fatalf("the waiting call whose worker was killed: %v %+v", err, got)
	}
	if n := slotStarts(t, js, id); n != 1 {
		t.Errorf("its handler ran %d times", n)
	}
	var types []string
	for _, ev := range trail(t, c, id) {
		types = append(types, ev.Type)
		if ev.Type == audit.EventTakenOver && (ev.Data["state"] != "claimed" || ev.Data["fromWorker"] != "wait-victim") {
			t.Errorf("taken over from %v", ev.Data)
		}
	}
	if want := []string{audit.EventTakenOver, audit.EventStarted, audit.EventCompleted}; !slices.Equal(types, want) {
		t.Errorf("its trail %v, want %v", types, want)
	}
}
