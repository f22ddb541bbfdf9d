package executor_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/execution"
	"github.com/capstan-dev/capstan/internal/testhooks"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/demo"
	"github.com/capstan-dev/capstan/internal/testenv"
)

type none struct{}

// failing is a capability whose handler always returns a declared error,
// retryable or not, counting its calls.
func failing(id string, m executor.Meta, retryable bool, calls *atomic.Int64) executor.Capability {
	m.Description = "Fails on purpose."
	m.Expose = executor.On(executor.SurfaceDirect)
	return executor.Define(id, m, func(ctx context.Context, c executor.Call[none]) (none, error) {
		calls.Add(1)
		if retryable {
			return none{}, executor.Retryable("Failed; another attempt may work.")
		}
		return none{}, executor.Fail("Failed for good.")
	})
}

// TestSI11_RetryEligibilityTable runs every combination of side effect,
// idempotent, retry configured, error retryable and retryOn, and counts the
// handler's calls: three (one plus two retries) only when SI-11 allows it,
// else one. Combinations the registry refuses are checked to be refused.
func TestSI11_RetryEligibilityTable(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	nc := env.Connect(t)

	type tcase struct {
		id         string
		sideEffect executor.SideEffect
		idempotent bool
		configured bool
		retryable  bool
		retryOn    string // unset, allows, vetoes
		calls      atomic.Int64
		retryOnArg atomic.Value // what retryOn received
	}
	var served, refused []*tcase
	var caps, refusedCaps []executor.Capability
	for _, se := range []executor.SideEffect{executor.SideEffectNone, executor.SideEffectRead, executor.SideEffectWrite, executor.SideEffectDestructive, executor.SideEffectExternal} {
		for _, idem := range []bool{false, true} {
			for _, configured := range []bool{false, true} {
				for _, retryable := range []bool{false, true} {
					for _, retryOn := range []string{"unset", "allows", "vetoes"} {
						tc := &tcase{sideEffect: se, idempotent: idem, configured: configured, retryable: retryable, retryOn: retryOn,
							id: fmt.Sprintf("t.%s.idempotent-%t.retry-%t.retryable-%t.retryon-%s", se, idem, configured, retryable, retryOn)}
						m := executor.Meta{SideEffect: se, Idempotent: idem}
						if configured || retryOn != "unset" {
							m.Retry = &executor.Retry{Backoff: time.Millisecond}
						}
						if configured {
							m.Retry.MaxAttempts = 2
						}
						if retryOn != "unset" {
							allow := retryOn == "allows"
							m.Retry.RetryOn = func(err error) bool {
								tc.retryOnArg.Store(err)
								return allow
							}
						}
						c := failing(tc.id, m, retryable, &tc.calls)
						writeLike := se == executor.SideEffectWrite || se == executor.SideEffectDestructive || se == executor.SideEffectExternal
						if writeLike && !idem && configured {
							refused, refusedCaps = append(refused, tc), append(refusedCaps, c)
							continue
						}
						served, caps = append(served, tc), append(caps, c)
					}
				}
			}
		}
	}

	// Refused: retry on a write-like capability without idempotent: true.
	_, err := executor.NewRegistry(refusedCaps...)
	var rerr *executor.RegistryError
	if !errors.As(err, &rerr) {
		t.Fatalf("registry accepted retry on write-like capabilities without idempotent: %v", err)
	}
	if len(rerr.Problems) != len(refused) {
		t.Fatalf("%d problems for %d refused capabilities:\n%v", len(rerr.Problems), len(refused), err)
	}
	for i, tc := range refused {
		if !strings.HasPrefix(rerr.Problems[i], tc.id+": ") || !strings.Contains(rerr.Problems[i], "idempotent") {
			t.Errorf("problem %d does not name %s and idempotent: %q", i, tc.id, rerr.Problems[i])
		}
	}

	w := startWorker(t, nc, executor.WorkerConfig{}, caps...)
	c := newClient(t, env.Connect(t))
	reqs := make([]executor.Request, len(served))
	for i, tc := range served {
		reqs[i] = executor.Request{CapabilityID: tc.id}
	}
	envs, errs := c.CallMany(ctxT(t), reqs)
	var total int64
	for i, tc := range served {
		if errs[i] != nil {
			t.Fatalf("%s: %v", tc.id, errs[i])
		}
		writeLike := tc.sideEffect == executor.SideEffectWrite || tc.sideEffect == executor.SideEffectDestructive || tc.sideEffect == executor.SideEffectExternal
		eligible := tc.configured && tc.retryable && (!writeLike || tc.idempotent) && tc.retryOn != "vetoes"
		want := int64(1)
		if eligible {
			want = 3
		}
		got := envs[i]
		calls := tc.calls.Load()
		total += calls
		if calls != want || got.Attempts != int(want) {
			t.Errorf("%s: %d handler calls, envelope attempts %d; want %d", tc.id, calls, got.Attempts, want)
		}
		if got.Status != envelope.StatusFailed || got.Error == nil || got.Error.Code != envelope.CodeExecutionFailed ||
			got.Error.Retryable != tc.retryable || !got.Error.ExposeToModel {
			t.Errorf("%s: envelope %s %+v", tc.id, got.Status, got.Error)
		}
		if arg := tc.retryOnArg.Load(); arg != nil {
			var ce *envelope.CapabilityError
			if !errors.As(arg.(error), &ce) || ce.Code != envelope.CodeExecutionFailed {
				t.Errorf("%s: retryOn received %v, not the attempt's CapabilityError", tc.id, arg)
			}
		}
	}
	if s := w.Stats(); int64(s.HandlerCalls) != total {
		t.Errorf("worker counted %d handler calls, the handlers %d", s.HandlerCalls, total)
	}
}

// TestSI11_RegistryRefusesRetryOnWriteLikeWithoutIdempotent: retry on write,
// destructive and external capabilities needs idempotent: true; the registry
// names every offending capability at once and none of the others.
func TestSI11_RegistryRefusesRetryOnWriteLikeWithoutIdempotent(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	retry := &executor.Retry{MaxAttempts: 1}
	_, err := executor.NewRegistry(
		failing("orders.write", executor.Meta{SideEffect: executor.SideEffectWrite, Retry: retry}, true, &calls),
		failing("orders.delete", executor.Meta{SideEffect: executor.SideEffectDestructive, Retry: retry}, true, &calls),
		failing("email.notify", executor.Meta{SideEffect: executor.SideEffectExternal, Retry: retry}, true, &calls),
		failing("orders.refund", executor.Meta{SideEffect: executor.SideEffectWrite, Idempotent: true, Retry: retry}, true, &calls),
		failing("orders.read", executor.Meta{SideEffect: executor.SideEffectRead, Retry: retry}, true, &calls),
		failing("email.draft", executor.Meta{SideEffect: executor.SideEffectExternal}, true, &calls),
	)
	var rerr *executor.RegistryError
	if !errors.As(err, &rerr) {
		t.Fatalf("registry accepted retry without idempotent: %v", err)
	}
	want := map[string]executor.SideEffect{"orders.write": executor.SideEffectWrite, "orders.delete": executor.SideEffectDestructive, "email.notify": executor.SideEffectExternal}
	if len(rerr.Problems) != len(want) {
		t.Fatalf("want one problem for each of %v, got:\n%v", want, err)
	}
	for _, p := range rerr.Problems {
		id, rest, _ := strings.Cut(p, ": ")
		se, ok := want[id]
		if !ok {
			t.Errorf("problem names %q, which is not at fault: %s", id, p)
			continue
		}
		if !strings.Contains(rest, string(se)) || !strings.Contains(rest, "idempotent") {
			t.Errorf("problem of %s does not explain itself: %s", id, p)
		}
		delete(want, id)
	}
	if len(want) > 0 {
		t.Errorf("not named: %v", want)
	}
}

func demoWorker(t *testing.T, env *testenv.Env) (*executor.Worker, *executor.Client) {
	t.Helper()
	nc := env.Connect(t)
	js, err := demo.Provision(ctxT(t), nc, 1)
	if err != nil {
		t.Fatal(err)
	}
	w := startWorker(t, nc, executor.WorkerConfig{}, demo.Catalog(js)...)
	return w, newClient(t, env.Connect(t))
}

// TestDemoFlaky_TwoFailuresThenCompletedOnTheThirdAttempt: the same execution
// id throughout, one capability.retried per re-attempt, attempts on the
// terminal event and the envelope.
func TestDemoFlaky_TwoFailuresThenCompletedOnTheThirdAttempt(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	w, c := demoWorker(t, env)

	got, err := c.Call(ctxT(t), "demo.flaky", demo.FlakyInput{FailTimes: 2}, executor.As(alice))
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != envelope.StatusCompleted || got.Attempts != 3 {
		t.Fatalf("status %s, attempts %d, error %+v", got.Status, got.Attempts, got.Error)
	}
	var out demo.FlakyOutput
	if err := got.Output.Decode(&out); err != nil || out.Attempt != 3 {
		t.Fatalf("output %+v, err %v", out, err)
	}
	if n := w.Stats().HandlerCalls; n != 3 {
		t.Fatalf("%d handler calls", n)
	}

	evs := trail(t, c, got.ExecutionID)
	retried := ofType(evs, audit.EventRetried)
	if len(retried) != 2 {
		t.Fatalf("%d capability.retried events: %v", len(retried), typesOf(evs))
	}
	for i, ev := range retried {
		if intValue(ev.Data["attempt"]) != int64(i+2) || ev.Data["previousErrorCode"] != string(envelope.CodeExecutionFailed) {
			t.Errorf("retried #%d: %v", i, ev.Data)
		}
	}
	for _, ev := range evs {
		if ev.ExecutionID != got.ExecutionID {
			t.Errorf("%s carries execution %s, not %s", ev.Type, ev.ExecutionID, got.ExecutionID)
		}
	}
	if started := ofType(evs, audit.EventStarted); len(started) != 3 {
		t.Errorf("%d capability.started events", len(started))
	}
	last := evs[len(evs)-1]
	if last.Type != audit.EventCompleted || intValue(last.Data["attempts"]) != 3 {
		t.Errorf("terminal event %s %v", last.Type, last.Data)
	}
}

// TestDemoFlaky_ThreeFailuresFailAfterThreeAttempts: the retries are used up.
func TestDemoFlaky_ThreeFailuresFailAfterThreeAttempts(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	w, c := demoWorker(t, env)

	got, err := c.Call(ctxT(t), "demo.flaky", demo.FlakyInput{FailTimes: 3}, executor.As(alice))
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != envelope.StatusFailed || got.Error == nil || got.Error.Code != envelope.CodeExecutionFailed || got.Attempts != 3 {
		t.Fatalf("status %s, attempts %d, error %+v", got.Status, got.Attempts, got.Error)
	}
	if n := w.Stats().HandlerCalls; n != 3 {
		t.Fatalf("%d handler calls", n)
	}
	evs := trail(t, c, got.ExecutionID)
	if n := len(ofType(evs, audit.EventRetried)); n != 2 {
		t.Errorf("%d capability.retried events", n)
	}
	last := evs[len(evs)-1]
	if last.Type != audit.EventFailed || intValue(last.Data["attempts"]) != 3 || last.Data["code"] != string(envelope.CodeExecutionFailed) {
		t.Errorf("terminal event %s %v", last.Type, last.Data)
	}
}

// A write that is not idempotent and outlives its timeout may have taken
// effect before it was stopped: its envelope tells the caller, and the
// model, not to simply call again (not retryable, and why), where an
// idempotent write's says another call is safe.
func TestTimeout_AWriteThatMayHaveTakenEffectIsNotRetryable(t *testing.T) {
	t.Parallel()
	charged := make(chan struct{}, 2)
	charge := func(id string, idempotent bool) executor.Capability {
		return executor.Define(id, executor.Meta{Description: "Charges, then hangs.", Expose: executor.On(executor.SurfaceDirect),
			SideEffect: executor.SideEffectExternal, Idempotent: idempotent, Timeout: 200 * time.Millisecond},
			func(ctx context.Context, _ executor.Call[struct{}]) (none, error) {
				charged <- struct{}{} // the effect, then a hang past the timeout
				<-ctx.Done()
				return none{}, ctx.Err()
			})
	}
	reg, err := executor.NewRegistry(charge("t.charge", false), charge("t.charge-idempotent", true))
	if err != nil {
		t.Fatal(err)
	}
	w := trackedWorker(t, reg)
	c := w.Client(t, executor.ClientConfig{Actor: alice})
	for _, tc := range []struct {
		id        string
		retryable bool
	}{{"t.charge", false}, {"t.charge-idempotent", true}} {
		got, err := c.Call(ctxT(t), tc.id, struct{}{})
		if err != nil {
			t.Fatal(err)
		}
		<-charged
		if got.Status != envelope.StatusCancelled || got.Error == nil || got.Error.Code != envelope.CodeTimeout || got.Attempts != 1 {
			t.Fatalf("%s: status %s, attempts %d, error %+v", tc.id, got.Status, got.Attempts, got.Error)
		}
		fm := got.ForModel()
		if got.Error.Retryable != tc.retryable || fm.Retryable != tc.retryable {
			t.Errorf("%s: retryable %v, for the model %v; want %v", tc.id, got.Error.Retryable, fm.Retryable, tc.retryable)
		}
		if warned := strings.Contains(fm.Message, "may have taken effect"); warned == tc.retryable {
			t.Errorf("%s: the model reads %q", tc.id, fm.Message)
		}
	}
}

// TestDemoSleep_TimesOutOnBothAttempts: the timeout arms per attempt, a
// timeout is retried for a read, and a last timeout ends the execution as
// status cancelled with code TIMEOUT.
func TestDemoSleep_TimesOutOnBothAttempts(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	w, c := demoWorker(t, env)

	got, err := c.Call(ctxT(t), "demo.sleep", demo.SleepInput{Ms: 5000}, executor.As(alice))
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != envelope.StatusCancelled || got.Error == nil || got.Error.Code != envelope.CodeTimeout || got.Attempts != 2 {
		t.Fatalf("status %s, attempts %d, error %+v", got.Status, got.Attempts, got.Error)
	}
	if !got.Error.Retryable || got.Error.Stage != envelope.StageTimeout || got.ForModel().Code != envelope.CodeTimeout {
		t.Errorf("error %+v, for the model %+v", got.Error, got.ForModel())
	}
	if n := w.Stats().HandlerCalls; n != 2 {
		t.Fatalf("%d handler calls", n)
	}
	evs := trail(t, c, got.ExecutionID)
	retried := ofType(evs, audit.EventRetried)
	if len(retried) != 1 || intValue(retried[0].Data["attempt"]) != 2 || retried[0].Data["previousErrorCode"] != string(envelope.CodeTimeout) {
		t.Errorf("retried events %v", retried)
	}
	last := evs[len(evs)-1]
	if last.Type != audit.EventCancelled || last.Data["code"] != string(envelope.CodeTimeout) || intValue(last.Data["attempts"]) != 2 {
		t.Errorf("terminal event %s %v", last.Type, last.Data)
	}
}

// TestTimeout_ArmsPerAttempt_ARetryGetsAFreshTimeout: Meta.Timeout bounds
// each attempt, not the execution: the attempt after a timed-out one runs
// under a deadline of its own, later than the first's, and completes.
func TestTimeout_ArmsPerAttempt_ARetryGetsAFreshTimeout(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	var (
		mu        sync.Mutex
		deadlines []time.Time
	)
	read := executor.Define("stock.read", executor.Meta{
		Description: "Times out on its first attempt, then answers at once.",
		Expose:      executor.On(executor.SurfaceDirect), SideEffect: executor.SideEffectRead, Timeout: time.Second,
		Retry: &executor.Retry{MaxAttempts: 1, Backoff: time.Millisecond},
	}, func(ctx context.Context, c executor.Call[none]) (none, error) {
		d, _ := ctx.Deadline()
		mu.Lock()
		deadlines = append(deadlines, d)
		mu.Unlock()
		if c.Attempt == 1 {
			<-ctx.Done()
			return none{}, ctx.Err()
		}
		return none{}, ctx.Err()
	})
	startWorker(t, env.Connect(t), executor.WorkerConfig{}, read)
	c := newClient(t, env.Connect(t))

	got, err := c.Call(ctxT(t), "stock.read", nil)
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if got.Status != envelope.StatusCompleted || got.Attempts != 2 {
		t.Fatalf("status %s after %d attempts, error %+v; want completed after 2 (deadlines %v)", got.Status, got.Attempts, got.Error, deadlines)
	}
	if len(deadlines) != 2 || deadlines[0].IsZero() || !deadlines[1].After(deadlines[0]) {
		t.Fatalf("attempt deadlines %v: the second attempt must run under a later deadline of its own", deadlines)
	}
}

// blocking is a capability whose handler waits for its context to end.
func blocking(id string, m executor.Meta, calls *atomic.Int64) executor.Capability {
	m.Description = "Waits for its context."
	m.Expose = executor.On(executor.SurfaceDirect)
	return executor.Define(id, m, func(ctx context.Context, c executor.Call[none]) (none, error) {
		calls.Add(1)
		<-ctx.Done()
		return none{}, ctx.Err()
	})
}

// TestSI11_TimedOutWriteRetriedOnlyWhenIdempotent: TIMEOUT is retryable, but
// a write is re-attempted only with idempotent: true and retry configured.
func TestSI11_TimedOutWriteRetriedOnlyWhenIdempotent(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	nc := env.Connect(t)
	var plain, idem, idemNoRetry atomic.Int64
	timeout := 50 * time.Millisecond
	startWorker(t, nc, executor.WorkerConfig{},
		blocking("orders.write", executor.Meta{SideEffect: executor.SideEffectWrite, Timeout: timeout}, &plain),
		blocking("orders.write-idempotent", executor.Meta{SideEffect: executor.SideEffectWrite, Idempotent: true, Timeout: timeout,
			Retry: &executor.Retry{MaxAttempts: 1, Backoff: time.Millisecond}}, &idem),
		blocking("orders.write-idempotent-no-retry", executor.Meta{SideEffect: executor.SideEffectWrite, Idempotent: true, Timeout: timeout}, &idemNoRetry),
	)
	c := newClient(t, env.Connect(t))
	for _, tc := range []struct {
		id    string
		calls *atomic.Int64
		want  int
	}{
		{"orders.write", &plain, 1},
		{"orders.write-idempotent", &idem, 2},
		{"orders.write-idempotent-no-retry", &idemNoRetry, 1},
	} {
		got, err := c.Call(ctxT(t), tc.id, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got.Status != envelope.StatusCancelled || got.Error == nil || got.Error.Code != envelope.CodeTimeout {
			t.Errorf("%s: status %s, error %+v", tc.id, got.Status, got.Error)
		}
		if got.Attempts != tc.want || tc.calls.Load() != int64(tc.want) {
			t.Errorf("%s: attempts %d, handler calls %d; want %d", tc.id, got.Attempts, tc.calls.Load(), tc.want)
		}
	}
}

// TestIdempotencyKey_StableAcrossAttemptsDistinctAcrossExecutions: the key is
// derived from the execution id alone.
func TestIdempotencyKey_StableAcrossAttemptsDistinctAcrossExecutions(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	nc := env.Connect(t)
	var mu sync.Mutex
	keys := map[string][]string{} // execution id -> key of each attempt
	charge := executor.Define("payments.charge", executor.Meta{
		Description: "Charges twice unless deduplicated.", Expose: executor.On(executor.SurfaceDirect),
		SideEffect: executor.SideEffectWrite, Idempotent: true, Retry: &executor.Retry{MaxAttempts: 2, Backoff: time.Millisecond},
	}, func(ctx context.Context, c executor.Call[map[string]any]) (none, error) {
		mu.Lock()
		keys[c.ExecutionID] = append(keys[c.ExecutionID], c.IdempotencyKey)
		mu.Unlock()
		if c.Attempt < 3 {
			return none{}, executor.Retryable("The gateway did not answer.")
		}
		return none{}, nil
	})
	startWorker(t, nc, executor.WorkerConfig{}, charge)
	c := newClient(t, env.Connect(t))

	input := map[string]any{"orderId": "o-1", "amount": 30}
	var ids []string
	for range 2 {
		got, err := c.Call(ctxT(t), "payments.charge", input)
		if err != nil {
			t.Fatal(err)
		}
		if got.Status != envelope.StatusCompleted || got.Attempts != 3 {
			t.Fatalf("status %s, attempts %d, error %+v", got.Status, got.Attempts, got.Error)
		}
		ids = append(ids, got.ExecutionID)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, id := range ids {
		ks := keys[id]
		if len(ks) != 3 {
			t.Fatalf("execution %s: %d attempts seen", id, len(ks))
		}
		for i, k := range ks {
			if k == "" || k != envelope.IdempotencyKey(broker.Anonymous, id) {
				t.Errorf("execution %s attempt %d: key %q, want the key of its execution id", id, i+1, k)
			}
		}
	}
	if keys[ids[0]][0] == keys[ids[1]][0] {
		t.Errorf("two executions with identical input share the key %s", keys[ids[0]][0])
	}
}

var errStale = errors.New("stale read")

// TestHandlerErrors_OnlyDeclaredErrorsSpeak: a declared error sets code,
// retryability and an exposed message; anything else is EXECUTION_FAILED, not
// retryable and not exposed, and is never retried.
func TestHandlerErrors_OnlyDeclaredErrorsSpeak(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name      string
		err       error
		panics    bool
		code      envelope.Code
		message   string
		retryable bool
		exposed   bool
		calls     int64
	}{
		{name: "fail", err: executor.Fail("The order is closed."),
			code: envelope.CodeExecutionFailed, message: "The order is closed.", exposed: true, calls: 1},
		{name: "retryable", err: executor.Retryable("The bank is busy."),
			code: envelope.CodeExecutionFailed, message: "The bank is busy.", retryable: true, exposed: true, calls: 2},
		{name: "own-code", err: executor.Fail("Already refunded.", executor.WithCode("ALREADY_REFUNDED"), executor.WithCause(errStale)),
			code: "ALREADY_REFUNDED", message: "Already refunded.", exposed: true, calls: 1},
		{name: "wrapped", err: fmt.Errorf("refund: %w", executor.Retryable("The bank is busy.")),
			code: envelope.CodeExecutionFailed, message: "The bank is busy.", retryable: true, exposed: true, calls: 2},
		{name: "concealed", err: executor.Fail("Ledger row 42 is locked.", executor.Concealed()),
			code: envelope.CodeExecutionFailed, message: "Ledger row 42 is locked.", calls: 1},
		{name: "runtime-code", err: executor.Retryable("Downstream timed out.", executor.WithCode(envelope.CodeTimeout)),
			code: envelope.CodeExecutionFailed, message: "Downstream timed out.", retryable: true, exposed: true, calls: 2},
		{name: "plain", err: errors.New("pq: password authentication failed for user app"),
			code: envelope.CodeExecutionFailed, message: "The operation failed.", calls: 1},
		{name: "context-looking", err: fmt.Errorf("dial: %w", context.DeadlineExceeded),
			code: envelope.CodeExecutionFailed, message: "The operation failed.", calls: 1},
		{name: "panic", panics: true,
			code: envelope.CodeExecutionFailed, message: "The operation failed.", calls: 1},
	}
	env := testenv.Start(t)
	nc := env.Connect(t)
	counts := make([]atomic.Int64, len(cases))
	var caps []executor.Capability
	for i, tc := range cases {
		caps = append(caps, executor.Define("errors."+tc.name, executor.Meta{
			Description: "Returns a given error.", Expose: executor.On(executor.SurfaceDirect), SideEffect: executor.SideEffectRead,
			Retry: &executor.Retry{MaxAttempts: 1, Backoff: time.Millisecond},
		}, func(ctx context.Context, c executor.Call[none]) (none, error) {
			counts[i].Add(1)
			if tc.panics {
				panic("index out of range")
			}
			return none{}, tc.err
		}))
	}
	startWorker(t, nc, executor.WorkerConfig{}, caps...)
	c := newClient(t, env.Connect(t))
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := c.Call(ctxT(t), "errors."+tc.name, nil)
			if err != nil {
				t.Fatal(err)
			}
			e := got.Error
			if got.Status != envelope.StatusFailed || e == nil {
				t.Fatalf("status %s, error %+v", got.Status, e)
			}
			if e.Code != tc.code || e.Message != tc.message || e.Retryable != tc.retryable || e.ExposeToModel != tc.exposed ||
				e.Stage != envelope.StageHandler {
				t.Errorf("error %+v", e)
			}
			if n := counts[i].Load(); n != tc.calls || got.Attempts != int(tc.calls) {
				t.Errorf("handler calls %d, attempts %d; want %d", n, got.Attempts, tc.calls)
			}
			fm := got.ForModel()
			if tc.exposed && (fm.Code != tc.code || fm.Message != tc.message) {
				t.Errorf("the model sees %+v", fm)
			}
			if !tc.exposed && (fm.Code != envelope.CodeInternalError || fm.Message != "The operation failed." || fm.Retryable) {
				t.Errorf("the model sees %+v", fm)
			}
		})
	}
}

// TestRetryOn_SeesTheCapabilityErrorAndTheHandlersError: RetryOn receives the
// attempt's CapabilityError; the handler's own error is reachable through it.
func TestRetryOn_SeesTheCapabilityErrorAndTheHandlersError(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	nc := env.Connect(t)
	var calls atomic.Int64
	var seen []envelope.Code
	var mu sync.Mutex
	stock := executor.Define("stock.read", executor.Meta{
		Description: "Reads stock; a stale read is worth another attempt, nothing else.",
		// Attempts 1 and 3 return at once: the timeout must outlast them on a
		// loaded machine; attempt 2 waits for it.
		Expose: executor.On(executor.SurfaceDirect), SideEffect: executor.SideEffectRead, Timeout: time.Second,
		Retry: &executor.Retry{MaxAttempts: 5, Backoff: time.Millisecond, RetryOn: func(err error) bool {
			var ce *envelope.CapabilityError
			if !errors.As(err, &ce) {
				return false
			}
			mu.Lock()
			seen = append(seen, ce.Code)
			mu.Unlock()
			return errors.Is(err, errStale) || errors.Is(err, context.DeadlineExceeded)
		}},
	}, func(ctx context.Context, c executor.Call[none]) (none, error) {
		switch calls.Add(1) {
		case 1:
			return none{}, fmt.Errorf("replica: %w", executor.Retryable("The stock is being updated.", executor.WithCause(errStale)))
		case 2:
			<-ctx.Done() // times out
			return none{}, ctx.Err()
		default:
			return none{}, executor.Retryable("The warehouse is offline.")
		}
	})
	startWorker(t, nc, executor.WorkerConfig{}, stock)
	c := newClient(t, env.Connect(t))

	got, err := c.Call(ctxT(t), "stock.read", nil)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != envelope.StatusFailed || got.Attempts != 3 || calls.Load() != 3 {
		t.Fatalf("status %s, attempts %d, calls %d, error %+v", got.Status, got.Attempts, calls.Load(), got.Error)
	}
	mu.Lock()
	defer mu.Unlock()
	want := []envelope.Code{envelope.CodeExecutionFailed, envelope.CodeTimeout, envelope.CodeExecutionFailed}
	if fmt.Sprint(seen) != fmt.Sprint(want) {
		t.Errorf("retryOn saw %v, want %v", seen, want)
	}
}

// TestRetryOn_PanicVetoesTheRetry: a RetryOn that panics does not take the
// worker down; the error is final.
func TestRetryOn_PanicVetoesTheRetry(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	nc := env.Connect(t)
	var calls atomic.Int64
	m := executor.Meta{SideEffect: executor.SideEffectRead, Retry: &executor.Retry{MaxAttempts: 2, Backoff: time.Millisecond,
		RetryOn: func(err error) bool { panic("bug in retryOn") }}}
	startWorker(t, nc, executor.WorkerConfig{}, failing("flaky.read", m, true, &calls), echoCap(nil))
	c := newClient(t, env.Connect(t))

	got, err := c.Call(ctxT(t), "flaky.read", nil)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != envelope.StatusFailed || got.Attempts != 1 || calls.Load() != 1 {
		t.Fatalf("status %s, attempts %d, calls %d", got.Status, got.Attempts, calls.Load())
	}
	if got, err := c.Call(ctxT(t), "demo.echo", map[string]any{"hello": "still here"}); err != nil || got.Status != envelope.StatusCompleted {
		t.Fatalf("worker after the panic: %v %+v", err, got)
	}
}

// trail reads one execution's audit events up to and including its terminal
// event, which the worker emits asynchronously just before the envelope. It
// reads with message gets (audit.Read): no consumer per poll.
func trail(t *testing.T, c *executor.Client, executionID string) []audit.Event {
	t.Helper()
	ctx := ctxT(t)
	for {
		evs, err := c.Trail(ctx, executionID)
		if err != nil && !errors.Is(err, broker.ErrNotFound) {
			t.Fatal(err)
		}
		for i, ev := range evs {
			switch ev.Type {
			case audit.EventCompleted, audit.EventFailed, audit.EventCancelled:
				return evs[:i+1]
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the trail of %s has no terminal event: %v", executionID, typesOf(evs))
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func ofType(evs []audit.Event, typ string) []audit.Event {
	var out []audit.Event
	for _, ev := range evs {
		if ev.Type == typ {
			out = append(out, ev)
		}
	}
	return out
}

// TestTakeoverInBackoff_FollowsTheRetryRule: an execution whose worker was
// lost during a backoff is re-attempted under the same id (previous error
// WORKER_LOST) when SI-11 allows it; when RetryOn vetoes, the recorded
// TIMEOUT ends it as cancelled/TIMEOUT like any last timeout.
func TestTakeoverInBackoff_FollowsTheRetryRule(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	var calls atomic.Int64
	retryOn := func(err error) bool {
		var ce *envelope.CapabilityError
		return errors.As(err, &ce) && ce.Code != envelope.CodeWorkerLost
	}
	define := func(id string, veto bool) executor.Capability {
		r := &executor.Retry{MaxAttempts: 2, Backoff: time.Millisecond}
		if veto {
			r.RetryOn = retryOn
		}
		return executor.Define(id, executor.Meta{Description: "Succeeds.", Expose: executor.On(executor.SurfaceDirect),
			SideEffect: executor.SideEffectRead, Timeout: time.Second, Retry: r,
		}, func(ctx context.Context, c executor.Call[none]) (int, error) {
			calls.Add(1)
			return c.Attempt, nil
		})
	}
	startWorker(t, env.Connect(t), executor.WorkerConfig{}, define("stock.read", false), define("stock.read-strict", true))
	c := newClient(t, env.Connect(t))
	ctx := ctxT(t)

	for _, tc := range []struct {
		capID    string
		status   envelope.Status
		attempts int
		calls    int64
	}{
		{"stock.read", envelope.StatusCompleted, 2, 1},
		{"stock.read-strict", envelope.StatusCancelled, 1, 0},
	} {
		t.Run(tc.capID, func(t *testing.T) {
			before := calls.Load()
			id := envelope.NewExecutionID()
			past := time.Now().UTC().Add(-time.Minute)
			// The record a worker lost during its backoff after a timeout leaves.
			if _, err := broker.Create(ctx, testhooks.Broker(c).Executions, broker.Key(broker.Anonymous, id), &execution.Record{V: 1, ExecutionID: id, CapabilityID: tc.capID,
				State: execution.StateBackoff, Attempt: 1, Worker: "lost-worker", LeaseUntil: past, LastError: envelope.CodeTimeout,
				CreatedAt: past, UpdatedAt: past}); err != nil {
				t.Fatal(err)
			}
			got, err := c.Call(ctx, tc.capID, nil, executor.WithID(id))
			if err != nil {
				t.Fatal(err)
			}
			if got.Status != tc.status || got.Attempts != tc.attempts || calls.Load()-before != tc.calls {
				t.Fatalf("status %s, attempts %d, calls %d, error %+v", got.Status, got.Attempts, calls.Load()-before, got.Error)
			}
			evs := trail(t, c, id)
			retried := ofType(evs, audit.EventRetried)
			if tc.status == envelope.StatusCompleted {
				if len(retried) != 1 || intValue(retried[0].Data["attempt"]) != 2 || retried[0].Data["previousErrorCode"] != string(envelope.CodeWorkerLost) {
					t.Errorf("retried %v", retried)
				}
				return
			}
			if len(retried) != 0 || got.Error.Code != envelope.CodeTimeout {
				t.Errorf("retried %v, error %+v", retried, got.Error)
			}
		})
	}
}
