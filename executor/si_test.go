package executor_test

// Security invariants of capstan, each proven by the test named after it:
//
//	SI-1  exposure is deny-by-default per surface: a capability is reachable
//	      only from the surfaces it lists.
//	SI-2  exposure is enforced at execution, not only at discovery: whatever a
//	      caller was shown, the worker checks the surface again; the surface is
//	      fixed by the client or adapter, never by the request's payload.
//	SI-3  an actor is required and well-formed: kind user, service, agent or
//	      anonymous; anonymous is explicit, never assumed from an omission.
//	SI-4  an approval binds the exact input it was granted for (by hash): the
//	      approvals tests prove it.
//	SI-5  an approval is consumed at most once: the approvals tests prove it.
//	SI-6  handlers, policies and approvals see only the validated input.
//	SI-7  policies fail closed: an error, panic or timeout denies
//	      (POLICY_FAILED), and every stance is recorded.
//	SI-8  concealment: an unknown, an unexposed and a hidden capability are
//	      indistinguishable to the caller; the trail records the true reason.
//	SI-9  errors are model-safe: a model sees ForModel only, and an undeclared
//	      error never leaks its message or cause.
//	SI-10 the audit trail never carries raw input or output.
//
// SI-11 and SI-12 (retries and finalization) are proven with the retry and
// crash tests.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/execution"
	"github.com/capstan-dev/capstan/internal/testhooks"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/demo"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// trailEvent is one stored audit event and its bytes.
type trailEvent struct {
	audit.Event
	raw []byte
}

// trailUntil reads the audit events filed under id until one of type last
// appears; raw is the stored message that carried each.
func trailUntil(t *testing.T, c *executor.Client, id string, last ...string) []trailEvent {
	t.Helper()
	b := testhooks.Broker(c)
	ctx := ctxT(t)
	key := broker.Key(c.Principal(), id)
	cons, err := b.Audit.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{b.Names.AuditSubject(key)}})
	if err != nil {
		t.Fatal(err)
	}
	var evs []trailEvent
	for {
		batch, err := cons.Fetch(100, jetstream.FetchMaxWait(200*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		done := false
		// The batch is read to its end so that no fetch outlives the test.
		for m := range batch.Messages() {
			// The subject is the id's shard: other executions' events too.
			if m.Headers().Get(broker.AuditExecutionHeader) != key {
				continue
			}
			msgEvs, err := audit.Decode(m.Data())
			if err != nil {
				t.Fatalf("audit event does not decode: %v", err)
			}
			for _, ev := range msgEvs {
				if done {
					continue
				}
				evs = append(evs, trailEvent{ev, m.Data()})
				for _, l := range last {
					done = done || ev.Type == l
				}
			}
		}
		if done {
			return evs
		}
		if ctx.Err() != nil {
			t.Fatalf("no %v event for %s; trail: %v", last, id, trailTypes(evs))
		}
	}
}

func terminalTrail(t *testing.T, c *executor.Client, id string) []trailEvent {
	t.Helper()
	return trailUntil(t, c, id, audit.EventCompleted, audit.EventFailed, audit.EventCancelled)
}

func trailTypes(evs []trailEvent) []string {
	var s []string
	for _, e := range evs {
		s = append(s, e.Type)
	}
	return s
}

func eventOf(t *testing.T, evs []trailEvent, typ string) trailEvent {
	t.Helper()
	for _, e := range evs {
		if e.Type == typ {
			return e
		}
	}
	t.Fatalf("no %s event in %v", typ, trailTypes(evs))
	return trailEvent{}
}

// surfaceClient is a client of one surface acting as alice by default.
func surfaceClient(t *testing.T, nc *nats.Conn, s executor.Surface) *executor.Client {
	t.Helper()
	c, err := executor.NewClient(nc, executor.ClientConfig{Surface: s, Actor: alice})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

type anyIn = map[string]any

// counted defines a capability that counts its calls and echoes its input.
func counted(id string, calls *atomic.Int64, meta executor.Meta) executor.Capability {
	if meta.Description == "" {
		meta.Description = "A test capability."
	}
	if meta.SideEffect == "" {
		meta.SideEffect = executor.SideEffectNone
	}
	return executor.Define(id, meta, func(ctx context.Context, c executor.Call[anyIn]) (anyIn, error) {
		calls.Add(1)
		return c.Input, nil
	})
}

func startAll(t *testing.T, nc *nats.Conn, cfg executor.WorkerConfig, caps ...executor.Capability) *executor.Worker {
	t.Helper()
	w := startWorker(t, nc, cfg, caps...)
	for _, c := range caps[1:] {
		waitServing(t, nc, c.ID())
	}
	return w
}

func mustFail(t *testing.T, env *envelope.Envelope, err error, code envelope.Code) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	if env.Status != envelope.StatusFailed || env.Error == nil || env.Error.Code != code {
		t.Fatalf("status %s, error %+v: want failed %s", env.Status, env.Error, code)
	}
}

func TestSI1_ExposureDenyByDefaultPerSurface(t *testing.T) {
	t.Parallel()
	e := testenv.Start(t)
	var nowhere, mcpOnly atomic.Int64
	// No exposure at all is a registry problem: nothing could ever call it.
	_, err := executor.NewRegistry(counted("si1.nowhere", &nowhere, executor.Meta{}))
	var re *executor.RegistryError
	if !errors.As(err, &re) || len(re.Problems) != 1 || !strings.Contains(re.Problems[0], "si1.nowhere: exposed on no surface") {
		t.Fatalf("a capability exposed on no surface: %v", err)
	}
	startAll(t, e.Connect(t), executor.WorkerConfig{},
		counted("si1.echo", new(atomic.Int64), executor.Meta{Expose: executor.On(executor.SurfaceDirect)}),
		counted("si1.mcp-only", &mcpOnly, executor.Meta{Expose: executor.On(executor.SurfaceMCP)}))
	nc := e.Connect(t)
	for _, s := range []executor.Surface{executor.SurfaceDirect, executor.SurfaceHTTP} {
		env, err := surfaceClient(t, nc, s).Call(ctxT(t), "si1.mcp-only", anyIn{})
		mustFail(t, env, err, envelope.CodeCapabilityNotFound)
	}
	env, err := surfaceClient(t, nc, executor.SurfaceMCP).Call(ctxT(t), "si1.mcp-only", anyIn{"x": 1})
	if err != nil || env.Status != envelope.StatusCompleted {
		t.Fatalf("on its surface: %v %+v", err, env)
	}
	if nowhere.Load() != 0 || mcpOnly.Load() != 1 {
		t.Fatalf("handler calls: unexposed %d, mcp-only %d", nowhere.Load(), mcpOnly.Load())
	}
}

func TestSI2_ExposureEnforcedAtExecution(t *testing.T) {
	t.Parallel()
	e := testenv.Start(t)
	var calls, hidden atomic.Int64
	bob := envelope.Actor{Kind: envelope.ActorUser, ID: "bob"}
	hideFromBob := executor.Policy{Name: "hide-from-bob", Phases: []executor.Phase{executor.PhaseDiscovery},
		Evaluate: func(ctx context.Context, r executor.PolicyRequest) (executor.Decision, error) {
			if r.Actor.ID == "bob" {
				return executor.Decision{Stance: executor.StanceHide, Reason: "bob does not see payroll"}, nil
			}
			return executor.Decision{Stance: executor.StanceAllow}, nil
		}}
	startAll(t, e.Connect(t), executor.WorkerConfig{},
		counted("si2.mcp-only", &calls, executor.Meta{Expose: executor.On(executor.SurfaceMCP)}),
		counted("si2.payroll", &hidden, executor.Meta{Expose: executor.On(executor.SurfaceDirect), Policies: []executor.Policy{hideFromBob}}))
	direct := surfaceClient(t, e.Connect(t), executor.SurfaceDirect)

	// Discovery does not show it to the direct surface ...
	d := describe(t, direct, "", alice, executor.Scope{})
	for _, c := range d.Capabilities {
		if c.ID == "si2.mcp-only" {
			t.Fatal("discovery showed an mcp-only capability to the direct surface")
		}
	}
	// ... and a caller that calls it anyway is refused by the worker.
	env, err := direct.Call(ctxT(t), "si2.mcp-only", anyIn{})
	mustFail(t, env, err, envelope.CodeCapabilityNotFound)
	denied := eventOf(t, terminalTrail(t, direct, env.ExecutionID), audit.EventDenied)
	if denied.Data["reason"] != "not-exposed" || denied.Data["stage"] != envelope.StageExposure {
		t.Fatalf("denied event %+v", denied.Data)
	}

	// The surface is the client's, never the request's: an option that
	// rewrites it, or an input that names one, changes nothing.
	forge := executor.CallOption(func(r *envelope.Request) { r.Surface = string(executor.SurfaceMCP) })
	env, err = direct.Call(ctxT(t), "si2.mcp-only", anyIn{"surface": "mcp"}, forge)
	mustFail(t, env, err, envelope.CodeCapabilityNotFound)

	// What discovery hides from an actor stays concealed when it calls anyway.
	d = describe(t, direct, "", bob, executor.Scope{})
	for _, c := range d.Capabilities {
		if c.ID == "si2.payroll" {
			t.Fatal("discovery showed bob a capability hidden from him")
		}
	}
	env, err = direct.Call(ctxT(t), "si2.payroll", anyIn{}, executor.As(bob))
	mustFail(t, env, err, envelope.CodeCapabilityNotFound)
	denied = eventOf(t, terminalTrail(t, direct, env.ExecutionID), audit.EventDenied)
	if denied.Data["reason"] != "hidden-at-discovery" {
		t.Fatalf("denied event %+v", denied.Data)
	}
	if env, err := direct.Call(ctxT(t), "si2.payroll", anyIn{}); err != nil || env.Status != envelope.StatusCompleted {
		t.Fatalf("alice may call it: %v %+v", err, env)
	}
	if calls.Load() != 0 || hidden.Load() != 1 {
		t.Fatalf("handler calls: mcp-only %d, payroll %d", calls.Load(), hidden.Load())
	}
}

func TestSI3_ActorRequiredAndWellFormed(t *testing.T) {
	t.Parallel()
	e := testenv.Start(t)
	var calls atomic.Int64
	startAll(t, e.Connect(t), executor.WorkerConfig{}, counted("si3.cap", &calls, executor.Meta{Expose: executor.On(executor.SurfaceDirect)}))
	// No default actor: what a call does not name, it does not have.
	c, err := executor.NewClient(e.Connect(t), executor.ClientConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	for _, tc := range []struct {
		name  string
		actor envelope.Actor
		ok    bool
	}{
		{"omitted", envelope.Actor{}, false},
		{"id without kind", envelope.Actor{ID: "alice"}, false},
		{"unknown kind", envelope.Actor{Kind: "root", ID: "alice"}, false},
		{"user without id", envelope.Actor{Kind: envelope.ActorUser}, false},
		{"service without id", envelope.Actor{Kind: envelope.ActorService}, false},
		{"control character", envelope.Actor{Kind: envelope.ActorUser, ID: "al\x00ice"}, false},
		{"invalid UTF-8", envelope.Actor{Kind: envelope.ActorAgent, ID: "\xff"}, false},
		{"overlong id", envelope.Actor{Kind: envelope.ActorUser, ID: strings.Repeat("a", 257)}, false},
		{"kind in upper case", envelope.Actor{Kind: "User", ID: "alice"}, false},
		{"user", envelope.Actor{Kind: envelope.ActorUser, ID: "alice"}, true},
		{"service", envelope.Actor{Kind: envelope.ActorService, ID: "billing"}, true},
		{"agent", envelope.Actor{Kind: envelope.ActorAgent, ID: "support-bot"}, true},
		{"explicit anonymous", envelope.Actor{Kind: envelope.ActorAnonymous}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := calls.Load()
			env, err := c.Call(ctxT(t), "si3.cap", anyIn{}, executor.As(tc.actor))
			if tc.ok {
				if err != nil || env.Status != envelope.StatusCompleted {
					t.Fatalf("%v %+v", err, env.Error)
				}
				return
			}
			mustFail(t, env, err, envelope.CodeUnauthenticated)
			if env.Error.Stage != envelope.StageActor || calls.Load() != before {
				t.Fatalf("stage %s, handler calls %d", env.Error.Stage, calls.Load()-before)
			}
			_, err = c.Describe(ctxT(t), executor.SurfaceDirect, tc.actor, executor.Scope{})
			var ce *envelope.CapabilityError
			if !errors.As(err, &ce) || ce.Code != envelope.CodeUnauthenticated {
				t.Fatalf("describe as a malformed actor: %v", err)
			}
		})
	}
}

// normalizedEmail lower-cases and trims its address when validated: what
// policies and the handler see must be the value after Validate.
type normalizedEmail struct {
	To    string `json:"to"`
	Count uint8  `json:"count,omitempty"`
}

func (n *normalizedEmail) Validate() error {
	n.To = strings.ToLower(strings.TrimSpace(n.To))
	if !strings.Contains(n.To, "@") {
		return &envelope.InputError{Issues: []envelope.Issue{{Path: "to", Message: "not an address"}}}
	}
	return nil
}

func TestSI6_HandlersAndPoliciesSeeOnlyTheValidatedInput(t *testing.T) {
	t.Parallel()
	e := testenv.Start(t)
	var mu sync.Mutex
	seen := map[executor.Phase]any{}
	record := executor.Policy{Name: "record", Phases: []executor.Phase{executor.PhaseInvocation, executor.PhaseExecution},
		Evaluate: func(ctx context.Context, r executor.PolicyRequest) (executor.Decision, error) {
			mu.Lock()
			defer mu.Unlock()
			in, ok := r.Input.(*normalizedEmail)
			if !ok {
				return executor.Decision{}, fmt.Errorf("policy input is %T", r.Input)
			}
			seen[r.Phase] = *in
			return executor.Decision{Stance: executor.StanceAllow}, nil
		}}
	var calls atomic.Int64
	startAll(t, e.Connect(t), executor.WorkerConfig{Policies: []executor.Policy{record}},
		executor.Define("si6.mail", executor.Meta{Description: "Mails.", Expose: executor.On(executor.SurfaceDirect), SideEffect: executor.SideEffectNone},
			func(ctx context.Context, c executor.Call[normalizedEmail]) (normalizedEmail, error) {
				calls.Add(1)
				return c.Input, nil
			}))
	c := newClient(t, e.Connect(t))

	env, err := c.Call(ctxT(t), "si6.mail", json.RawMessage(`{"to":"  Alice@Example.COM "}`))
	if err != nil || env.Status != envelope.StatusCompleted {
		t.Fatalf("%v %+v", err, env.Error)
	}
	var out normalizedEmail
	if err := env.Output.Decode(&out); err != nil || out.To != "alice@example.com" {
		t.Fatalf("the handler saw %+v (%v)", out, err)
	}
	want := normalizedEmail{To: "alice@example.com"}
	for _, ph := range []executor.Phase{executor.PhaseInvocation, executor.PhaseExecution} {
		if seen[ph] != want {
			t.Fatalf("%s policy saw %+v", ph, seen[ph])
		}
	}

	// Inputs that would reach the handler bent by a lenient decoder never
	// reach a policy or the handler at all.
	for _, raw := range []string{
		`{"to":"a@b.c","cc":"x@y.z"}`, // unknown field
		`{"to":"a@b.c","count":300}`,  // would wrap to 44
		`{"to":"a@b.c","count":-1}`,   // would wrap to 255
		`["a@b.c", 1]`,                // would be read by position
		`{"to":"nobody"}`,             // refused by Validate
	} {
		clear(seen)
		before := calls.Load()
		env, err := c.Call(ctxT(t), "si6.mail", json.RawMessage(raw))
		mustFail(t, env, err, envelope.CodeInputInvalid)
		if len(seen) != 0 || calls.Load() != before {
			t.Fatalf("%s reached policies %v or the handler", raw, seen)
		}
	}
}

func TestSI7_PoliciesFailClosed(t *testing.T) {
	t.Parallel()
	e := testenv.Start(t)
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	policies := []executor.Policy{
		{Name: "panics", Evaluate: func(context.Context, executor.PolicyRequest) (executor.Decision, error) {
			panic("policy bug")
		}},
		{Name: "sleeps", Evaluate: func(ctx context.Context, r executor.PolicyRequest) (executor.Decision, error) {
			<-release // past the policy timeout, ignoring its context
			return executor.Decision{Stance: executor.StanceAllow}, nil
		}},
		{Name: "errors", Evaluate: func(context.Context, executor.PolicyRequest) (executor.Decision, error) {
			return executor.Decision{}, errors.New("policy store unreachable")
		}},
		{Name: "allows", Evaluate: func(context.Context, executor.PolicyRequest) (executor.Decision, error) {
			return executor.Decision{Stance: executor.StanceAllow}, nil
		}},
	}
	var calls atomic.Int64
	startAll(t, e.Connect(t), executor.WorkerConfig{Policies: policies, PolicyTimeout: 100 * time.Millisecond},
		counted("si7.cap", &calls, executor.Meta{Expose: executor.On(executor.SurfaceDirect)}))
	c := newClient(t, e.Connect(t))

	env, err := c.Call(ctxT(t), "si7.cap", anyIn{})
	mustFail(t, env, err, envelope.CodePolicyFailed)
	if calls.Load() != 0 || env.Error.Stage != envelope.StagePolicy {
		t.Fatalf("handler calls %d, stage %s", calls.Load(), env.Error.Stage)
	}
	denied := eventOf(t, terminalTrail(t, c, env.ExecutionID), audit.EventDenied)
	if denied.Data["reason"] != "policy-failed" {
		t.Fatalf("denied %+v", denied.Data)
	}
	var got []executor.PolicyRecord
	b, _ := json.Marshal(denied.Data["policyDecisions"])
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	want := []executor.PolicyRecord{
		{Policy: "panics", Stance: executor.StanceDeny, Failed: true, Failure: "panic"},
		{Policy: "sleeps", Stance: executor.StanceDeny, Failed: true, Failure: "timeout"},
		{Policy: "errors", Stance: executor.StanceDeny, Failed: true, Failure: "error"},
		{Policy: "allows", Stance: executor.StanceAllow},
	}
	if len(got) != len(want) {
		t.Fatalf("policy decisions %+v", got)
	}
	for i, w := range want {
		g := got[i]
		if g.Policy != w.Policy || g.Stance != w.Stance || g.Failed != w.Failed || g.Failure != w.Failure || g.Phase != executor.PhaseInvocation {
			t.Errorf("decision %d: %+v, want %+v", i, g, w)
		}
	}

	// A failing discovery-phase policy withholds the capability from
	// discovery, and the trail says why.
	disc := policies[2]
	disc.Name, disc.Phases = "discovery-errors", []executor.Phase{executor.PhaseDiscovery}
	e2 := testenv.Start(t)
	startAll(t, e2.Connect(t), executor.WorkerConfig{Policies: []executor.Policy{disc}},
		counted("si7.listed", &calls, executor.Meta{Expose: executor.On(executor.SurfaceDirect)}))
	c2 := newClient(t, e2.Connect(t))
	d := describe(t, c2, "", alice, executor.Scope{})
	if len(d.Capabilities) != 0 {
		t.Fatalf("listed %v despite a failing discovery policy", d.Capabilities)
	}
	ev := eventOf(t, trailUntil(t, c2, d.ID, audit.EventDiscovered), audit.EventDiscovered)
	if w, _ := json.Marshal(ev.Data["withheld"]); !bytes.Contains(w, []byte(`"reason":"policy-failed"`)) {
		t.Fatalf("discovered %+v", ev.Data)
	}
}

func TestSI8_NotFoundNotExposedHiddenIndistinguishable(t *testing.T) {
	t.Parallel()
	e := testenv.Start(t)
	var calls atomic.Int64
	hide := executor.Policy{Name: "hide", Evaluate: func(context.Context, executor.PolicyRequest) (executor.Decision, error) {
		return executor.Decision{Stance: executor.StanceHide, Reason: "not for this caller"}, nil
	}}
	hideAtDiscovery := hide
	hideAtDiscovery.Phases = []executor.Phase{executor.PhaseDiscovery}
	startAll(t, e.Connect(t), executor.WorkerConfig{},
		counted("si8.mcp-only", &calls, executor.Meta{Expose: executor.On(executor.SurfaceMCP)}),
		counted("si8.hidden", &calls, executor.Meta{Expose: executor.On(executor.SurfaceDirect), Policies: []executor.Policy{hide}}),
		counted("si8.hidden-listing", &calls, executor.Meta{Expose: executor.On(executor.SurfaceDirect), Policies: []executor.Policy{hideAtDiscovery}}),
		counted("si8.visible", &calls, executor.Meta{Expose: executor.On(executor.SurfaceDirect)}))
	c := newClient(t, e.Connect(t))

	cases := []struct{ id, reason string }{
		{"si8.no-such-capability", "unknown"},
		{"si8.mcp-only", "not-exposed"},
		{"si8.hidden", "policy-hidden"},
		{"si8.hidden-listing", "hidden-at-discovery"},
	}
	var first *envelope.Envelope
	var firstError, firstModel []byte
	for _, tc := range cases {
		env, err := c.Call(ctxT(t), tc.id, anyIn{"q": 1})
		mustFail(t, env, err, envelope.CodeCapabilityNotFound)
		errBytes, err := envelope.Marshal(env.Error)
		if err != nil {
			t.Fatal(err)
		}
		model, _ := json.Marshal(env.ForModel())
		if first == nil {
			first, firstError, firstModel = env, errBytes, model
			t.Logf("error on the wire: %x\nfor the model: %s", errBytes, model)
		} else {
			if !bytes.Equal(errBytes, firstError) || !bytes.Equal(model, firstModel) {
				t.Fatalf("%s: error %x / %s differs from an unknown id's %x / %s", tc.reason, errBytes, model, firstError, firstModel)
			}
			if env.Status != first.Status || env.Attempts != first.Attempts || env.Output != nil || env.Approval != nil {
				t.Fatalf("%s: envelope %+v differs from an unknown id's %+v", tc.reason, env, first)
			}
		}
		// The trail keeps the truth.
		denied := eventOf(t, terminalTrail(t, c, env.ExecutionID), audit.EventDenied)
		if denied.Data["reason"] != tc.reason || denied.Data["publicCode"] != string(envelope.CodeCapabilityNotFound) {
			t.Fatalf("%s: denied event %+v", tc.id, denied.Data)
		}
	}
	if calls.Load() != 0 {
		t.Fatalf("%d handler calls", calls.Load())
	}

	// A slip of a name the caller may see is answered with it; near names
	// it may not see never are, and each concealed id is answered as an
	// unknown one of the same spelling.
	for _, tc := range []struct{ id, near string }{
		{"si8.visibel", "si8.visible"},
		{"si8.hidden-listinx", ""}, // near si8.hidden-listing, hidden from this caller's discovery
		{"si8.mcp-onyl", ""},       // near si8.mcp-only, not exposed on direct
		{"si8.hidden", ""},         // hidden itself: as unknown
		{"si8.mcp-only", ""},       // not exposed: as unknown
		{"si8.zzzzzzzzzzz", ""},    // near nothing
	} {
		env, err := c.Call(ctxT(t), tc.id, anyIn{"q": 1})
		mustFail(t, env, err, envelope.CodeCapabilityNotFound)
		want := "No such capability."
		if tc.near != "" {
			want = "No such capability. Did you mean " + tc.near + "?"
		}
		if env.Error.Message != want || (tc.near != "") != (env.Error.Details["didYouMean"] == tc.near) {
			t.Fatalf("%s: %q %v, want %q", tc.id, env.Error.Message, env.Error.Details, want)
		}
	}
}

// describe asks for a description, waiting for a worker to serve discovery:
// a worker lists its capabilities in the catalog before it subscribes.
func describe(t *testing.T, c *executor.Client, s executor.Surface, a envelope.Actor, scope executor.Scope) *executor.Discovery {
	t.Helper()
	ctx := ctxT(t)
	for {
		d, err := c.Describe(ctx, s, a, scope)
		if err == nil {
			return d
		}
		if !errors.Is(err, executor.ErrNoWorkers) || ctx.Err() != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// finalizedStatus waits for the record to say finalized: the worker writes it
// just after the envelope.
func finalizedStatus(t *testing.T, c *executor.Client, id string) *executor.ExecutionStatus {
	t.Helper()
	ctx := ctxT(t)
	for {
		st, err := c.Status(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if st.Record != nil && st.Record.State == execution.StateFinalized {
			return st
		}
		select {
		case <-ctx.Done():
			t.Fatalf("record of %s never finalized: %+v", id, st.Record)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// syncBuffer collects a logger's output across goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestSI9_ModelSafeErrors(t *testing.T) {
	t.Parallel()
	e := testenv.Start(t)
	logs := &syncBuffer{}
	secret := "dsn=postgres://app:hunter2@db"
	fail := func(id string, err error) executor.Capability {
		return executor.Define(id, executor.Meta{Description: "Fails.", Expose: executor.On(executor.SurfaceDirect), SideEffect: executor.SideEffectNone},
			func(ctx context.Context, c executor.Call[anyIn]) (anyIn, error) {
				if id == "si9.panics" {
					panic(secret)
				}
				return nil, err
			})
	}
	startAll(t, e.Connect(t), executor.WorkerConfig{Logger: slog.New(slog.NewTextHandler(logs, nil))},
		fail("si9.undeclared", fmt.Errorf("connect %s: refused", secret)),
		fail("si9.panics", nil),
		fail("si9.declared", &envelope.CapabilityError{Code: "ALREADY_REFUNDED", Message: "The order was already refunded.",
			ExposeToModel: true, Details: map[string]any{"refundId": "r-1"}, Cause: errors.New(secret)}),
		fail("si9.declared-private", &envelope.CapabilityError{Code: envelope.CodeExecutionFailed, Message: "Ledger " + secret,
			Retryable: true}))
	c := newClient(t, e.Connect(t))
	internal := `{"code":"INTERNAL_ERROR","message":"The operation failed.","retryable":false}`
	for _, tc := range []struct {
		id       string
		code     envelope.Code
		forModel string
	}{
		{"si9.undeclared", envelope.CodeExecutionFailed, internal},
		{"si9.panics", envelope.CodeExecutionFailed, internal},
		{"si9.declared", "ALREADY_REFUNDED", `{"code":"ALREADY_REFUNDED","message":"The order was already refunded.","retryable":false}`},
		{"si9.declared-private", envelope.CodeExecutionFailed, internal},
	} {
		t.Run(tc.id, func(t *testing.T) {
			env, err := c.Call(ctxT(t), tc.id, anyIn{})
			mustFail(t, env, err, tc.code)
			if m, _ := json.Marshal(env.ForModel()); string(m) != tc.forModel {
				t.Fatalf("for the model: %s, want %s", m, tc.forModel)
			}
			// The undeclared cause never leaves the worker in the envelope.
			wire, _ := envelope.Marshal(env)
			asJSON, _ := json.Marshal(env)
			if tc.id != "si9.declared-private" && (bytes.Contains(wire, []byte("hunter2")) || bytes.Contains(asJSON, []byte("hunter2"))) {
				t.Fatalf("the envelope carries the cause: %s", asJSON)
			}
			if tc.id == "si9.undeclared" && env.Error.Message != "The operation failed." {
				t.Fatalf("message %q", env.Error.Message)
			}
			// Operators keep the real cause: the record (capstan status) and the logs.
			st := finalizedStatus(t, c, env.ExecutionID)
			if tc.id != "si9.declared-private" && !strings.Contains(st.Record.Cause, "hunter2") {
				t.Fatalf("record cause %q", st.Record.Cause)
			}
			for _, ev := range terminalTrail(t, c, env.ExecutionID) {
				if bytes.Contains(ev.raw, []byte("hunter2")) {
					t.Fatalf("%s event carries the cause", ev.Type)
				}
			}
		})
	}
	if !strings.Contains(logs.String(), "hunter2") {
		t.Fatal("the logs lost the cause")
	}

	// ForModel itself: details travel with INPUT_INVALID only, an unexposed
	// error says nothing.
	for _, tc := range []struct {
		err  envelope.CapabilityError
		want string
	}{
		{envelope.CapabilityError{Code: envelope.CodeInputInvalid, Message: "The input is invalid.", ExposeToModel: true,
			Details: map[string]any{"issues": []any{"x"}}}, `{"code":"INPUT_INVALID","message":"The input is invalid.","retryable":false,"details":{"issues":["x"]}}`},
		{envelope.CapabilityError{Code: envelope.CodeTimeout, Message: "Slow.", Retryable: true, ExposeToModel: true,
			Details: map[string]any{"private": 1}}, `{"code":"TIMEOUT","message":"Slow.","retryable":true}`},
		{envelope.CapabilityError{Code: envelope.CodePolicyDenied, Message: "secret reason", Retryable: true,
			Cause: errors.New(secret)}, internal},
	} {
		if got, _ := json.Marshal(tc.err.ForModel()); string(got) != tc.want {
			t.Errorf("ForModel %s, want %s", got, tc.want)
		}
	}
}

type secretOut struct {
	Token string `json:"token"`
}

func (s secretOut) Validate() error {
	if strings.HasPrefix(s.Token, "bad") {
		return errors.New("token " + s.Token + " is malformed")
	}
	return nil
}

func TestSI10_AuditNeverCarriesInputOrOutput(t *testing.T) {
	t.Parallel()
	e := testenv.Start(t)
	const marker = "zq-secret-7731"
	deny := executor.Policy{Name: "deny-deny", Evaluate: func(ctx context.Context, r executor.PolicyRequest) (executor.Decision, error) {
		if in, _ := r.Input.(*anyIn); in != nil && (*in)["deny"] != nil {
			return executor.Decision{Stance: executor.StanceDeny, Reason: "deny requested"}, nil
		}
		return executor.Decision{Stance: executor.StanceAllow}, nil
	}}
	startAll(t, e.Connect(t), executor.WorkerConfig{Policies: []executor.Policy{deny}},
		executor.Define("si10.cap", executor.Meta{Description: "Echoes a token.", Expose: executor.On(executor.SurfaceDirect), SideEffect: executor.SideEffectNone},
			func(ctx context.Context, c executor.Call[anyIn]) (secretOut, error) {
				if c.Input["fail"] != nil {
					return secretOut{}, fmt.Errorf("failed on %v", c.Input["v"])
				}
				return secretOut{Token: fmt.Sprint(c.Input["prefix"], c.Input["v"])}, nil
			}),
		executor.Define("si10.typed", executor.Meta{Description: "Typed.", Expose: executor.On(executor.SurfaceDirect), SideEffect: executor.SideEffectNone},
			func(ctx context.Context, c executor.Call[normalizedEmail]) (normalizedEmail, error) {
				return c.Input, nil
			}))
	c := newClient(t, e.Connect(t))
	for _, tc := range []struct {
		name   string
		id     string
		input  any
		status envelope.Status
	}{
		{"completed", "si10.cap", anyIn{"v": marker, "prefix": "ok-"}, envelope.StatusCompleted},
		{"handler error", "si10.cap", anyIn{"v": marker, "fail": true}, envelope.StatusFailed},
		{"output invalid", "si10.cap", anyIn{"v": marker, "prefix": "bad-"}, envelope.StatusFailed},
		{"policy denied", "si10.cap", anyIn{"v": marker, "deny": true}, envelope.StatusFailed},
		{"input invalid", "si10.typed", anyIn{"to": marker, marker: marker}, envelope.StatusFailed},
		{"not exposed", "si10.cap", anyIn{"v": marker}, envelope.StatusFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cl := c
			if tc.name == "not exposed" {
				cl = surfaceClient(t, e.Connect(t), executor.SurfaceMCP)
			}
			env, err := cl.Call(ctxT(t), tc.id, tc.input)
			if err != nil || env.Status != tc.status {
				t.Fatalf("%v, status %s %+v", err, env.Status, env.Error)
			}
			trail := terminalTrail(t, c, env.ExecutionID)
			for _, ev := range trail {
				if bytes.Contains(ev.raw, []byte(marker)) {
					t.Fatalf("%s event carries raw input or output: %q", ev.Type, ev.raw)
				}
			}
			// The trail identifies the input by its hash only.
			want, _ := envelope.InputHash(envelope.MustRaw(tc.input))
			if trail[0].InputHash != want {
				t.Fatalf("input hash %q, want %q", trail[0].InputHash, want)
			}
		})
	}
	d := describe(t, c, "", alice, executor.Scope{})
	for _, ev := range trailUntil(t, c, d.ID, audit.EventDiscovered) {
		if bytes.Contains(ev.raw, []byte(marker)) {
			t.Fatal("the discovery event carries input")
		}
	}
}

// The CLI's `capstan call orders.refund --input '{"orderId":1,"amount":"x"}'`
// through the demo catalog: both fields are reported, each at its path.
func TestInputInvalid_DemoRefundReportsEveryFieldPath(t *testing.T) {
	t.Parallel()
	e := testenv.Start(t)
	nc := e.Connect(t)
	js, err := demo.Provision(ctxT(t), nc, 1)
	if err != nil {
		t.Fatal(err)
	}
	startAll(t, nc, executor.WorkerConfig{}, demo.Catalog(js)...)
	c := newClient(t, e.Connect(t))
	env, err := c.Call(ctxT(t), "orders.refund", json.RawMessage(`{"orderId":1,"amount":"x"}`))
	mustFail(t, env, err, envelope.CodeInputInvalid)
	m, _ := json.Marshal(env.ForModel())
	want := `{"code":"INPUT_INVALID","message":"The input is invalid.","retryable":false,"details":{"issues":[` +
		`{"message":"expected an integer, got a string","path":"amount"},{"message":"expected a string, got an integer","path":"orderId"}]}}`
	if string(m) != want {
		t.Fatalf("for the model:\n%s\nwant\n%s", m, want)
	}
}

func TestOutput_ValidatedAndRedactedBeforeItLeaves(t *testing.T) {
	t.Parallel()
	e := testenv.Start(t)
	var calls atomic.Int64
	meta := executor.Meta{Description: "Issues a token.", Expose: executor.On(executor.SurfaceDirect), SideEffect: executor.SideEffectWrite}
	redacted := meta
	redacted.RedactOutput = func(out any) any {
		o := out.(secretOut)
		return map[string]any{"token": o.Token[:3] + "…"}
	}
	panics := meta
	panics.RedactOutput = func(any) any { panic("redaction bug") }
	handler := func(ctx context.Context, c executor.Call[anyIn]) (secretOut, error) {
		calls.Add(1)
		return secretOut{Token: c.Input["token"].(string)}, nil
	}
	startAll(t, e.Connect(t), executor.WorkerConfig{},
		executor.Define("out.plain", meta, handler),
		executor.Define("out.redacted", redacted, handler),
		executor.Define("out.redaction-panics", panics, handler))
	c := newClient(t, e.Connect(t))

	// An output its type refuses is withheld; the effect may have happened.
	env, err := c.Call(ctxT(t), "out.plain", anyIn{"token": "bad-token"})
	mustFail(t, env, err, envelope.CodeOutputInvalid)
	if env.Output != nil || env.Error.Stage != envelope.StageOutput || env.Attempts != 1 || calls.Load() != 1 {
		t.Fatalf("envelope %+v, calls %d", env, calls.Load())
	}
	failed := eventOf(t, terminalTrail(t, c, env.ExecutionID), audit.EventFailed)
	if failed.Data["executedBeforeFailure"] != true || failed.Data["code"] != string(envelope.CodeOutputInvalid) {
		t.Fatalf("failed event %+v", failed.Data)
	}

	// Only what redaction keeps leaves the worker.
	env, err = c.Call(ctxT(t), "out.redacted", anyIn{"token": "tok-12345"})
	if err != nil || env.Status != envelope.StatusCompleted {
		t.Fatalf("%v %+v", err, env.Error)
	}
	if b, _ := json.Marshal(env.Output); string(b) != `{"token":"tok…"}` {
		t.Fatalf("output %s", b)
	}

	// A redaction that panics withholds the output.
	env, err = c.Call(ctxT(t), "out.redaction-panics", anyIn{"token": "tok-12345"})
	mustFail(t, env, err, envelope.CodeInternalError)
	if env.Output != nil || env.Error.Stage != envelope.StageRedaction {
		t.Fatalf("envelope %+v", env)
	}
}

func TestDescribe_DescriptorsWithInputSchemaAndAuditedDigest(t *testing.T) {
	t.Parallel()
	e := testenv.Start(t)
	nc := e.Connect(t)
	js, err := demo.Provision(ctxT(t), nc, 1)
	if err != nil {
		t.Fatal(err)
	}
	askApproval := executor.Policy{Name: "agents-need-approval", Phases: []executor.Phase{executor.PhaseDiscovery},
		Evaluate: func(ctx context.Context, r executor.PolicyRequest) (executor.Decision, error) {
			if r.Actor.Kind == envelope.ActorAgent && r.Meta.SideEffect == executor.SideEffectWrite {
				return executor.Decision{Stance: executor.StanceRequireApproval}, nil
			}
			if r.Actor.Kind == envelope.ActorAgent && r.CapabilityID == "pool-b.mcp" {
				return executor.Decision{Stance: executor.StanceHide}, nil
			}
			return executor.Decision{Stance: executor.StanceAllow}, nil
		}}
	cfg := executor.WorkerConfig{Policies: []executor.Policy{askApproval}}
	startAll(t, nc, cfg, demo.Catalog(js)...)
	// Another pool: its capabilities are listed by whichever worker answers,
	// from the catalog, under the same runtime-level policies.
	var calls atomic.Int64
	cfg.Pool = "b"
	startAll(t, e.Connect(t), cfg,
		counted("pool-b.mcp", &calls, executor.Meta{Expose: executor.On(executor.SurfaceMCP), Tags: []string{"b"}}),
		counted("pool-b.direct", &calls, executor.Meta{Expose: executor.On(executor.SurfaceDirect)}))
	c := newClient(t, e.Connect(t))

	d := describe(t, c, executor.SurfaceMCP, alice, executor.Scope{})
	var ids []string
	for _, desc := range d.Capabilities {
		ids = append(ids, desc.ID)
		if desc.InputSchema == nil || desc.InputSchema["type"] != "object" || desc.InputSchema["$schema"] == nil {
			t.Errorf("%s: input schema %v", desc.ID, desc.InputSchema)
		}
	}
	wantIDs := "demo.echo demo.flaky demo.report demo.sleep email.send orders.refund pool-b.mcp"
	if strings.Join(ids, " ") != wantIDs || d.Surface != executor.SurfaceMCP {
		t.Fatalf("listed %v on %s, want %s", ids, d.Surface, wantIDs)
	}
	sum := sha256.Sum256([]byte(strings.ReplaceAll(wantIDs, " ", "\n") + "\n"))
	if d.Digest != hex.EncodeToString(sum[:]) {
		t.Fatalf("digest %s", d.Digest)
	}
	refund := d.Capabilities[5]
	if b, _ := json.Marshal(refund.InputSchema["required"]); string(b) != `["orderId","amount"]` || refund.RequiresApproval {
		t.Fatalf("orders.refund: %+v", refund)
	}
	ev := eventOf(t, trailUntil(t, c, d.ID, audit.EventDiscovered), audit.EventDiscovered)
	if ev.Data["digest"] != d.Digest || fmt.Sprint(ev.Data["count"]) != "7" || ev.Surface != "mcp" || ev.Actor.ID != "alice" {
		t.Fatalf("discovered event %+v", ev.Event)
	}

	// For an agent: the write needs approval, pool b's capability is hidden,
	// and the trail says which and why.
	agent := envelope.Actor{Kind: envelope.ActorAgent, ID: "support-bot"}
	d = describe(t, c, executor.SurfaceMCP, agent, executor.Scope{})
	ids = nil
	for _, desc := range d.Capabilities {
		ids = append(ids, desc.ID)
		if desc.RequiresApproval != (desc.ID == "orders.refund") {
			t.Errorf("%s: requiresApproval %v", desc.ID, desc.RequiresApproval)
		}
	}
	if strings.Join(ids, " ") != "demo.echo demo.flaky demo.report demo.sleep email.send orders.refund" {
		t.Fatalf("agent sees %v", ids)
	}
	ev = eventOf(t, trailUntil(t, c, d.ID, audit.EventDiscovered), audit.EventDiscovered)
	if w, _ := json.Marshal(ev.Data["withheld"]); !bytes.Contains(w, []byte(`"capabilityId":"pool-b.mcp","policyDecisions"`)) ||
		!bytes.Contains(w, []byte(`"reason":"policy-hidden"`)) {
		t.Fatalf("withheld %s", w)
	}

	// Scope narrows the listing.
	d, err = c.Describe(ctxT(t), executor.SurfaceMCP, alice, executor.Scope{Prefix: "demo."})
	if err != nil || len(d.Capabilities) != 4 {
		t.Fatalf("prefix scope: %v %v", err, d)
	}
	d, err = c.Describe(ctxT(t), executor.SurfaceMCP, alice, executor.Scope{Tags: []string{"demo", "payments"}})
	if err != nil || len(d.Capabilities) != 1 || d.Capabilities[0].ID != "orders.refund" {
		t.Fatalf("tags scope: %v %v", err, d)
	}
	// The client's own surface by default.
	d, err = c.Describe(ctxT(t), "", alice, executor.Scope{Prefix: "pool-b."})
	if err != nil || len(d.Capabilities) != 1 || d.Capabilities[0].ID != "pool-b.direct" {
		t.Fatalf("direct surface: %v %v", err, d)
	}
}
