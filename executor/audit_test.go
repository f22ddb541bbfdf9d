package executor_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/internal/testhooks"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/capstantest"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/demo"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// startDemo runs a worker serving the demo catalog, plus extra capabilities.
func startDemo(t *testing.T, nc *nats.Conn, cfg executor.WorkerConfig, extra ...executor.Capability) *executor.Worker {
	t.Helper()
	js, err := demo.Provision(ctxT(t), nc, 1)
	if err != nil {
		t.Fatal(err)
	}
	caps := append(demo.Catalog(js), extra...)
	w := startWorker(t, nc, cfg, caps...)
	for _, c := range caps[1:] {
		waitServing(t, nc, c.ID())
	}
	return w
}

// isTerminal reports whether an event ends an execution's trail; a call that
// waits for an approval ends with capability.approval_requested.
func isTerminal(typ string) bool {
	return typ == audit.EventCompleted || typ == audit.EventFailed || typ == audit.EventCancelled || typ == audit.EventApprovalRequested
}

// trailOf reads an execution's trail once its terminal event is stored: the
// worker emits that event asynchronously, just before it writes the envelope.
func trailOf(t *testing.T, b *broker.Broker, id string) []audit.Event {
	t.Helper()
	ctx := ctxT(t)
	for {
		trail, err := audit.Read(ctx, b.NC, b.Names.Prefix(), broker.Anonymous, id)
		if err == nil && isTerminal(trail[len(trail)-1].Type) {
			return trail
		}
		if err != nil && !errors.Is(err, broker.ErrNotFound) {
			t.Fatal(err)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the trail of %s has no terminal event: %v", id, typesOf(trail))
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func typesOf(trail []audit.Event) []string {
	out := make([]string, len(trail))
	for i, ev := range trail {
		out[i] = ev.Type
	}
	return out
}

func expectTypes(t *testing.T, trail []audit.Event, want ...string) {
	t.Helper()
	if got := typesOf(trail); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("trail %v, want %v", got, want)
	}
}

// dataInt reads an integer of an event's data, whatever width msgpack chose.
func dataInt(ev audit.Event, key string) int64 { return intValue(ev.Data[key]) }

// intValue reads an integer msgpack decoded at any width; -1 if v is none.
func intValue(v any) int64 {
	n, err := strconv.ParseInt(fmt.Sprint(v), 10, 64)
	if err != nil {
		return -1
	}
	return n
}

func call(t *testing.T, c *executor.Client, capID string, input any, opts ...executor.CallOption) *envelope.Envelope {
	t.Helper()
	env, err := c.Call(ctxT(t), capID, input, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return env
}

func TestAudit_EchoTrailIsRequestedStartedCompleted(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	w := startDemo(t, env.Connect(t), executor.WorkerConfig{})
	c := newClient(t, env.Connect(t))
	input := map[string]any{"hello": "world"}
	got := call(t, c, "demo.echo", input, executor.WithCorrelation("conv-1"))
	if got.Status != envelope.StatusCompleted {
		t.Fatalf("status %s, error %+v", got.Status, got.Error)
	}

	trail := trailOf(t, testhooks.Broker(c), got.ExecutionID)
	expectTypes(t, trail, audit.EventRequested, audit.EventStarted, audit.EventCompleted)
	wantHash, err := envelope.InputHash(envelope.MustRaw(input))
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range trail {
		if ev.ExecutionID != got.ExecutionID || ev.CapabilityID != "demo.echo" || ev.InputHash != wantHash ||
			ev.Actor != (audit.Actor{ID: "alice", Kind: "user"}) || ev.Surface != "direct" ||
			ev.CorrelationID != "conv-1" || ev.Worker != w.ID() || ev.V != 1 {
			t.Fatalf("%s: %+v", ev.Type, ev)
		}
	}
	if dataInt(trail[1], "attempt") != 1 || dataInt(trail[2], "attempts") != 1 {
		t.Fatalf("started %v, completed %v", trail[1].Data, trail[2].Data)
	}
}

func TestAudit_FlakyFailingTwiceIsOneExecutionWithTwoRetried(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	startDemo(t, env.Connect(t), executor.WorkerConfig{})
	c := newClient(t, env.Connect(t))
	got := call(t, c, "demo.flaky", demo.FlakyInput{FailTimes: 2})
	if got.Status != envelope.StatusCompleted || got.Attempts != 3 {
		t.Fatalf("status %s, attempts %d, error %+v", got.Status, got.Attempts, got.Error)
	}

	trail := trailOf(t, testhooks.Broker(c), got.ExecutionID)
	expectTypes(t, trail, audit.EventRequested,
		audit.EventStarted, audit.EventRetried, audit.EventStarted, audit.EventRetried, audit.EventStarted, audit.EventCompleted)
	for i, want := range []int64{1, 2, 2, 3, 3} {
		if n := dataInt(trail[1+i], "attempt"); n != want {
			t.Fatalf("%s #%d: attempt %d, want %d", trail[1+i].Type, i, n, want)
		}
	}
	for _, ev := range []audit.Event{trail[2], trail[4]} {
		if ev.Data["previousErrorCode"] != string(envelope.CodeExecutionFailed) {
			t.Fatalf("retried %v", ev.Data)
		}
	}
	if dataInt(trail[6], "attempts") != 3 {
		t.Fatalf("completed %v", trail[6].Data)
	}
	for _, ev := range trail {
		if ev.ExecutionID != got.ExecutionID {
			t.Fatalf("a retry changed the execution id: %s then %s", got.ExecutionID, ev.ExecutionID)
		}
	}
}

// A model calling the tool again is a new execution, not a retry: each call
// has its own id and its own capability.requested.
func TestAudit_ReinvocationIsANewExecutionWithItsOwnRequested(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	startDemo(t, env.Connect(t), executor.WorkerConfig{})
	c := newClient(t, env.Connect(t))
	first := call(t, c, "demo.echo", map[string]any{"q": 1})
	second := call(t, c, "demo.echo", map[string]any{"q": 1})
	if first.ExecutionID == second.ExecutionID {
		t.Fatalf("both calls ran as %s", first.ExecutionID)
	}
	for _, id := range []string{first.ExecutionID, second.ExecutionID} {
		trail := trailOf(t, testhooks.Broker(c), id)
		expectTypes(t, trail, audit.EventRequested, audit.EventStarted, audit.EventCompleted)
	}
}

func passThrough(id string, expose executor.Exposure, policies ...executor.Policy) executor.Capability {
	return executor.Define(id, executor.Meta{
		Description: "Returns its input.", Expose: expose, SideEffect: executor.SideEffectNone, Policies: policies,
	}, func(ctx context.Context, c executor.Call[map[string]any]) (map[string]any, error) {
		return c.Input, nil
	})
}

func stance(name string, s executor.Stance, phases ...executor.Phase) executor.Policy {
	return executor.Policy{Name: name, Phases: phases,
		Evaluate: func(context.Context, executor.PolicyRequest) (executor.Decision, error) {
			return executor.Decision{Stance: s, Reason: name + " says " + string(s)}, nil
		}}
}

// Every refusal is audited with why it happened, even where the caller is only
// told CAPABILITY_NOT_FOUND.
func TestAudit_DenialsRecordTheTrueReason(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	everywhere := executor.On(executor.SurfaceDirect, executor.SurfaceMCP)
	broken := executor.Policy{Name: "broken", Evaluate: func(context.Context, executor.PolicyRequest) (executor.Decision, error) {
		return executor.Decision{}, errors.New("the rules store is down")
	}}
	startDemo(t, env.Connect(t), executor.WorkerConfig{},
		passThrough("t.http-only", executor.On(executor.SurfaceHTTP)),
		passThrough("t.denied", everywhere, stance("no-way", executor.StanceDeny)),
		passThrough("t.hidden", everywhere, stance("secret", executor.StanceHide)),
		passThrough("t.broken", everywhere, broken),
		passThrough("t.late-deny", everywhere, stance("closing-time", executor.StanceDeny, executor.PhaseExecution)),
	)
	c := newClient(t, env.Connect(t))

	cases := []struct {
		name       string
		capID      string
		input      any
		opts       []executor.CallOption
		reason     string
		stage      string
		publicCode envelope.Code
		policy     string // the policy decision the event records, if any
	}{
		{"unknown capability", "no.such", nil, nil, "unknown", envelope.StageResolve, envelope.CodeCapabilityNotFound, ""},
		{"not exposed on the surface", "t.http-only", nil, nil, "not-exposed", envelope.StageExposure, envelope.CodeCapabilityNotFound, ""},
		{"invalid input", "email.send", demo.EmailInput{Subject: "hi"}, nil, "input-invalid", envelope.StageInput, envelope.CodeInputInvalid, ""},
		{"no actor kind", "demo.echo", nil, []executor.CallOption{executor.As(envelope.Actor{ID: "x", Kind: "robot"})},
			"unauthenticated", envelope.StageActor, envelope.CodeUnauthenticated, ""},
		{"policy denies", "t.denied", nil, nil, "policy-denied", envelope.StagePolicy, envelope.CodePolicyDenied, "no-way"},
		{"policy hides", "t.hidden", nil, nil, "policy-hidden", envelope.StagePolicy, envelope.CodeCapabilityNotFound, "secret"},
		{"policy fails closed", "t.broken", nil, nil, "policy-failed", envelope.StagePolicy, envelope.CodePolicyFailed, "broken"},
		{"execution-phase policy denies", "t.late-deny", nil, nil, "policy-denied", envelope.StageExecPolicy, envelope.CodePolicyDenied, "closing-time"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := call(t, c, tc.capID, tc.input, tc.opts...)
			if got.Status != envelope.StatusFailed || got.Error == nil || got.Error.Code != tc.publicCode {
				t.Fatalf("status %s, error %+v; want failed %s", got.Status, got.Error, tc.publicCode)
			}
			trail := trailOf(t, testhooks.Broker(c), got.ExecutionID)
			expectTypes(t, trail, audit.EventRequested, audit.EventDenied, audit.EventFailed)
			denied := trail[1]
			if denied.Data["reason"] != tc.reason || denied.Data["stage"] != tc.stage || denied.Data["publicCode"] != string(tc.publicCode) {
				t.Fatalf("denied %v; want reason %s, stage %s, publicCode %s", denied.Data, tc.reason, tc.stage, tc.publicCode)
			}
			if tc.policy != "" && !strings.Contains(fmt.Sprint(denied.Data["policyDecisions"]), tc.policy) {
				t.Fatalf("denied %v does not record the decision of %s", denied.Data, tc.policy)
			}
			if trail[2].Data["code"] != string(tc.publicCode) || trail[2].Data["executedBeforeFailure"] != false {
				t.Fatalf("failed %v", trail[2].Data)
			}
		})
	}
}

func TestAudit_UndecodableRequestIsAuditedAsDenied(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	startWorker(t, env.Connect(t), executor.WorkerConfig{}, echoCap(nil))
	c := newClient(t, env.Connect(t))
	ctx := ctxT(t)
	id := envelope.NewExecutionID()
	m := &nats.Msg{Subject: testhooks.Broker(c).Names.ExecSubject(broker.Anonymous, "demo.echo"), Data: []byte("\xc1 not msgpack"),
		Header: nats.Header{"Nats-Msg-Id": []string{id}}}
	if _, err := testhooks.Broker(c).JS.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Await(ctx, id); err != nil {
		t.Fatal(err)
	}
	trail := trailOf(t, testhooks.Broker(c), id)
	expectTypes(t, trail, audit.EventRequested, audit.EventDenied, audit.EventFailed)
	if trail[1].Data["reason"] != "undecodable" || trail[1].Data["publicCode"] != string(envelope.CodeInputInvalid) ||
		trail[1].CapabilityID != "demo.echo" {
		t.Fatalf("denied %+v", trail[1])
	}
}

// A cancel that arrives before any worker claimed the execution leaves a
// pending record; the worker that finds it audits the request, then its end.
func TestAudit_CancelBeforeClaimIsRequestedThenCancelled(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	var calls atomic.Int64
	startWorker(t, env.Connect(t), executor.WorkerConfig{}, echoCap(&calls))
	c := newClient(t, env.Connect(t))
	ctx := ctxT(t)
	id := envelope.NewExecutionID()
	if _, err := c.Cancel(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Submit(ctx, "demo.echo", echoIn{Hello: "late"}, executor.WithID(id)); err != nil {
		t.Fatal(err)
	}
	got, err := c.Await(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != envelope.StatusCancelled || calls.Load() != 0 {
		t.Fatalf("status %s, handler calls %d", got.Status, calls.Load())
	}
	trail := trailOf(t, testhooks.Broker(c), id)
	expectTypes(t, trail, audit.EventRequested, audit.EventCancelled)
	if trail[0].InputHash == "" || trail[0].Actor.ID != "alice" {
		t.Fatalf("requested %+v", trail[0])
	}
}

// SI-10: the trail carries a hash of the input, never the input or the output,
// whatever path the execution takes.
func TestSI10_NoAuditEventCarriesInputOrOutput(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	marker := "MARKER-" + uuid.NewString()
	leaky := executor.Define("t.leaky", executor.Meta{
		Description: "Fails with its input in the error.", Expose: executor.On(executor.SurfaceDirect), SideEffect: executor.SideEffectNone,
	}, func(ctx context.Context, c executor.Call[map[string]any]) (map[string]any, error) {
		return nil, &envelope.CapabilityError{Code: envelope.CodeExecutionFailed, ExposeToModel: true,
			Message: fmt.Sprint("refused ", c.Input), Cause: fmt.Errorf("input was %v", c.Input)}
	})
	badOut := executor.Define("t.bad-output", executor.Meta{
		Description: "Returns an output that does not validate.", Expose: executor.On(executor.SurfaceDirect), SideEffect: executor.SideEffectNone,
	}, func(ctx context.Context, c executor.Call[map[string]any]) (invalidOut, error) {
		return invalidOut{Secret: fmt.Sprint(c.Input["note"])}, nil
	})
	startDemo(t, env.Connect(t), executor.WorkerConfig{}, leaky, badOut)
	c := newClient(t, env.Connect(t))
	as := executor.As(envelope.Actor{ID: "alice", Kind: "user", Attrs: map[string]string{"note": marker}})

	calls := []struct {
		capID  string
		input  any
		status envelope.Status
	}{
		{"demo.echo", map[string]any{"note": marker}, envelope.StatusCompleted},
		// flaky's and sleep's inputs hold only numbers: the marker is in the
		// actor's attributes, and in an input that does not decode.
		{"demo.flaky", demo.FlakyInput{FailTimes: 1}, envelope.StatusCompleted},
		{"demo.flaky", map[string]any{"failTimes": marker}, envelope.StatusFailed},
		{"demo.sleep", demo.SleepInput{Ms: 1}, envelope.StatusCompleted},
		{"demo.sleep", map[string]any{"ms": marker}, envelope.StatusFailed},
		{"email.send", demo.EmailInput{To: marker + "@example.com", Subject: marker}, envelope.StatusCompleted},
		{"email.send", demo.EmailInput{Subject: marker}, envelope.StatusFailed}, // no address
		{"orders.refund", demo.RefundInput{OrderID: marker, Amount: 20}, envelope.StatusCompleted},
		{"orders.refund", demo.RefundInput{OrderID: marker, Amount: 900}, ""}, // needs an approval
		{"t.leaky", map[string]any{"note": marker}, envelope.StatusFailed},
		{"t.bad-output", map[string]any{"note": marker}, envelope.StatusFailed},
		{"no.such", map[string]any{"note": marker}, envelope.StatusFailed},
	}
	var ids []string
	for _, k := range calls {
		got := call(t, c, k.capID, k.input, as)
		if k.status != "" && got.Status != k.status {
			t.Fatalf("%s: status %s, error %+v; want %s", k.capID, got.Status, got.Error, k.status)
		}
		ids = append(ids, got.ExecutionID)
		// The marker does reach the worker and, where the output holds it, the
		// envelope: its absence from the trail is not for lack of it.
		if k.capID == "demo.echo" || k.capID == "orders.refund" && got.Status == envelope.StatusCompleted {
			if !bytes.Contains(got.Output, []byte(marker)) {
				t.Fatalf("%s: the output does not hold the marker", k.capID)
			}
		}
	}
	for _, id := range ids {
		trailOf(t, testhooks.Broker(c), id)
	}

	ctx := ctxT(t)
	info, err := testhooks.Broker(c).Audit.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// A quick execution's events are one message (DESIGN §14).
	if info.State.Msgs < uint64(len(calls)) {
		t.Fatalf("only %d messages on the audit stream", info.State.Msgs)
	}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		m, err := testhooks.Broker(c).Audit.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("sequence %d: %v", seq, err)
		}
		raw := append(bytes.Clone(m.Data), []byte(m.Subject+fmt.Sprint(m.Header))...)
		if bytes.Contains(raw, []byte(marker)) {
			evs, _ := audit.Decode(m.Data)
			t.Fatalf("the message at sequence %d carries the marker: %+v", seq, evs)
		}
	}
}

type invalidOut struct {
	Secret string `json:"secret"`
}

func (o invalidOut) Validate() error { return fmt.Errorf("secret %q must not leave", o.Secret) }

// fillAudit publishes filler on the audit stream until it refuses even the
// smallest write.
func fillAudit(t *testing.T, b *broker.Broker) {
	t.Helper()
	for _, size := range []int{256, 16, 0} {
		for i := 0; ; i++ {
			if i > 10000 {
				t.Fatal("the audit stream never refused a write")
			}
			if _, err := b.JS.Publish(ctxT(t), b.Names.AuditSubject("f"), make([]byte, size)); err != nil {
				break
			}
		}
	}
}

// fullAudit is an audit stream that refuses new events once full.
var fullAudit = broker.Config{AuditMaxBytes: 64 << 10, AuditDiscardNew: true}

// startFullAudit runs a worker and a client on an audit stream that refuses
// new events once full.
func startFullAudit(t *testing.T, env *testenv.Env, cfg executor.WorkerConfig, caps ...executor.Capability) (*executor.Client, *executor.Worker) {
	t.Helper()
	cfg.Deployment = executor.Deployment(fullAudit)
	if _, err := broker.Provision(ctxT(t), env.Connect(t), fullAudit); err != nil {
		t.Fatal(err)
	}
	c, err := executor.NewClient(env.Connect(t), executor.ClientConfig{Actor: alice, Deployment: executor.Deployment(fullAudit)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	reg, err := executor.NewRegistry(caps...)
	if err != nil {
		t.Fatal(err)
	}
	w := trackedWorker(t, reg, capstantest.WithConn(env.Connect(t)), capstantest.WithConfig(cfg))
	return c, w.Worker
}

func TestStrictAudit_UnavailableTrailFailsTheExecutionBeforeTheHandler(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	var calls atomic.Int64
	c, w := startFullAudit(t, env, executor.WorkerConfig{StrictAudit: true}, echoCap(&calls))

	// With room on the stream, strict mode runs normally.
	if got := call(t, c, "demo.echo", echoIn{Hello: "a"}); got.Status != envelope.StatusCompleted {
		t.Fatalf("with room: status %s, error %+v", got.Status, got.Error)
	}
	fillAudit(t, testhooks.Broker(c))
	got := call(t, c, "demo.echo", echoIn{Hello: "b"})
	if got.Status != envelope.StatusFailed || got.Error == nil || got.Error.Code != envelope.CodeAuditUnavailable || got.Error.Stage != envelope.StageControls {
		t.Fatalf("status %s, error %+v; want failed AUDIT_UNAVAILABLE at controls", got.Status, got.Error)
	}
	if got.Attempts != 0 || calls.Load() != 1 {
		t.Fatalf("attempts %d, handler calls %d: the handler ran without its started event stored", got.Attempts, calls.Load())
	}
	if w.Stats().AuditFailed == 0 {
		t.Fatal("the refused events are not counted")
	}
}

// logRecorder is a slog handler keeping every record.
type logRecorder struct {
	mu      sync.Mutex
	records []slog.Record
}

func (r *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *logRecorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.records = append(r.records, rec.Clone())
	return nil
}
func (r *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *logRecorder) WithGroup(string) slog.Handler      { return r }

func (r *logRecorder) count(msg string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, rec := range r.records {
		if rec.Message == msg {
			n++
		}
	}
	return n
}

func TestDefaultAudit_UnavailableTrailRunsAndReportsTheLoss(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	var calls atomic.Int64
	log := &logRecorder{}
	c, w := startFullAudit(t, env, executor.WorkerConfig{Logger: slog.New(log)}, echoCap(&calls))
	fillAudit(t, testhooks.Broker(c))

	got := call(t, c, "demo.echo", echoIn{Hello: "b"})
	if got.Status != envelope.StatusCompleted || calls.Load() != 1 {
		t.Fatalf("status %s, error %+v, handler calls %d; want completed after one call", got.Status, got.Error, calls.Load())
	}
	// requested, started and completed, one message, are refused: three
	// events counted, one message logged; the refusal arrives
	// asynchronously.
	ctx := ctxT(t)
	for w.Stats().AuditFailed < 3 || log.count("audit event not stored") < 1 {
		select {
		case <-ctx.Done():
			t.Fatalf("audit failures counted %d, logged %d; want 3 and 1", w.Stats().AuditFailed, log.count("audit event not stored"))
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// auditLoad is how many executions TestAudit_PipelineOrderUnderLoad submits
// at once: 2,000 by default, to keep the package quick under -race on a small
// machine; CAPSTAN_AUDIT_LOAD=10000 runs the full load.
func auditLoad(t *testing.T) int {
	if s := os.Getenv("CAPSTAN_AUDIT_LOAD"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			t.Fatalf("CAPSTAN_AUDIT_LOAD=%q is not a positive number", s)
		}
		return n
	}
	return 2000
}

// Thousands of executions submitted at once, served by two workers running
// 256 each, through four different paths: every execution's events are on the
// stream in its pipeline's order.
func TestAudit_PipelineOrderUnderLoad(t *testing.T) {
	t.Parallel()
	n := auditLoad(t)
	env := testenv.Start(t)
	cfg := executor.WorkerConfig{Concurrency: 256}
	startDemo(t, env.Connect(t), cfg)
	startDemo(t, env.Connect(t), cfg)
	c := newClient(t, env.Connect(t))

	kinds := []struct {
		capID string
		input any
		want  []string
	}{
		{"demo.echo", map[string]any{"n": 1},
			[]string{audit.EventRequested, audit.EventStarted, audit.EventCompleted}},
		{"demo.flaky", demo.FlakyInput{FailTimes: 1},
			[]string{audit.EventRequested, audit.EventStarted, audit.EventRetried, audit.EventStarted, audit.EventCompleted}},
		{"email.send", demo.EmailInput{Subject: "no address"},
			[]string{audit.EventRequested, audit.EventDenied, audit.EventFailed}},
		{"no.such", nil,
			[]string{audit.EventRequested, audit.EventDenied, audit.EventFailed}},
	}
	// Mostly echo; one in ten of each other path.
	kindOf := func(i int) int {
		if k := i % 10; k < len(kinds)-1 {
			return k + 1
		}
		return 0
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	// Submitted from many goroutines at once; the workers take them as fast as
	// they can, so thousands are in flight together.
	ids := make([]string, n)
	var wg sync.WaitGroup
	const submitters = 32
	failed := make(chan error, submitters)
	for s := 0; s < submitters; s++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := s; i < n; i += submitters {
				k := kinds[kindOf(i)]
				id, err := c.Submit(ctx, k.capID, k.input)
				if err != nil {
					failed <- err
					return
				}
				ids[i] = id
			}
		}()
	}
	wg.Wait()
	close(failed)
	if err := <-failed; err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{}
	for i, id := range ids {
		want[id] = kinds[kindOf(i)].want
	}
	if len(want) != n {
		t.Fatalf("%d execution ids for %d calls", len(want), n)
	}

	// Read the whole stream once, in stream order, until every execution's
	// terminal event has arrived.
	got := map[string][]string{}
	terminals := 0
	done := errors.New("all terminal events read")
	err := audit.Follow(ctx, testhooks.Broker(c).NC, testhooks.Broker(c).Names.Prefix(), audit.Filter{}, func(ev audit.Event) error {
		got[ev.ExecutionID] = append(got[ev.ExecutionID], ev.Type)
		if isTerminal(ev.Type) {
			terminals++
		}
		if terminals == n {
			return done
		}
		return nil
	}, audit.FromStart())
	if !errors.Is(err, done) {
		t.Fatalf("follow: %v after %d of %d terminal events", err, terminals, n)
	}
	for id, w := range want {
		if strings.Join(got[id], " ") != strings.Join(w, " ") {
			t.Fatalf("execution %s: trail %v, want %v", id, got[id], w)
		}
	}
}

// An execution that ends quickly is one message on the audit stream: its
// requested, started and terminal events, held and published together (DESIGN
// §14).
func TestAudit_QuickExecutionIsOneMessage(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	startDemo(t, env.Connect(t), executor.WorkerConfig{})
	c := newClient(t, env.Connect(t))
	got := call(t, c, "demo.echo", map[string]any{"hello": "world"})
	trail := trailOf(t, testhooks.Broker(c), got.ExecutionID)
	expectTypes(t, trail, audit.EventRequested, audit.EventStarted, audit.EventCompleted)
	if trail[0].Seq != trail[1].Seq || trail[1].Seq != trail[2].Seq {
		t.Fatalf("events stored at sequences %d, %d, %d: want one message", trail[0].Seq, trail[1].Seq, trail[2].Seq)
	}
}

// Holding events never hides a running execution: while its handler runs,
// its trail shows capability.started.
func TestAudit_RunningExecutionShowsStartedWhileItRuns(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	release := make(chan struct{})
	hold := executor.Define("test.hold", executor.Meta{
		Description: "Waits until released.",
		Expose:      executor.On(executor.SurfaceDirect),
		SideEffect:  executor.SideEffectNone,
	}, func(ctx context.Context, c executor.Call[map[string]any]) (map[string]any, error) {
		select {
		case <-release:
		case <-ctx.Done():
		}
		return map[string]any{}, nil
	})
	startDemo(t, env.Connect(t), executor.WorkerConfig{}, hold)
	c := newClient(t, env.Connect(t))
	id, err := c.Submit(ctxT(t), "test.hold", map[string]any{})
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "capability.started on the trail of a running execution", func() bool {
		trail, _ := audit.Read(ctxT(t), testhooks.Broker(c).NC, testhooks.Broker(c).Names.Prefix(), broker.Anonymous, id)
		return len(trail) == 2 && trail[1].Type == audit.EventStarted
	})
	close(release)
	expectTypes(t, trailOf(t, testhooks.Broker(c), id), audit.EventRequested, audit.EventStarted, audit.EventCompleted)
}

// With AuditUnacknowledged the trail is the same; only JetStream's
// acknowledgements are not asked for.
func TestAudit_UnacknowledgedEventsMakeTheSameTrail(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	startDemo(t, env.Connect(t), testhooks.Worker(executor.WorkerConfig{}, testhooks.WorkerKnobs{AuditUnacknowledged: true}))
	c := newClient(t, env.Connect(t))
	for _, input := range []map[string]any{{"hello": "world"}, {"n": 2}} {
		got := call(t, c, "demo.echo", input)
		expectTypes(t, trailOf(t, testhooks.Broker(c), got.ExecutionID), audit.EventRequested, audit.EventStarted, audit.EventCompleted)
	}
}
