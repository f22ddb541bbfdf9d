package executor_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/capstantest"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/execution"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/oplog"
	"github.com/capstan-dev/capstan/internal/policies"
	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/capstan-dev/capstan/internal/testhooks"
)

type mailIn struct {
	To      string `json:"to"`
	Subject string `json:"subject"`
}

func cedarMailCap(calls *atomic.Int64) executor.Capability {
	return executor.Define("t.mail", executor.Meta{Description: "Sends mail.", Expose: executor.On(executor.SurfaceDirect),
		SideEffect: executor.SideEffectExternal, Tags: []string{"mail"}},
		func(ctx context.Context, c executor.Call[mailIn]) (string, error) {
			calls.Add(1)
			return "sent to " + c.Input.To, nil
		})
}

// applyPolicies puts text in force as an admin of an open server would,
// validated against the catalog, and waits until every worker evaluates it.
func applyPolicies(t *testing.T, nc *nats.Conn, c *executor.Client, text string) (*policies.Change, error) {
	t.Helper()
	catalog, err := policies.Catalog(ctxT(t), testhooks.Broker(c).Catalog)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := policies.Apply(ctxT(t), nc, broker.NewNames(""), policies.Applying{File: "test.cedar", Text: []byte(text),
		Catalog: catalog, By: broker.Anonymous, Reason: "testing"})
	if err != nil {
		return nil, err
	}
	replies, err := oplog.Confirm(ctxT(t), nc, broker.NewNames(""), oplog.Policies, ch.Revision, "", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range replies {
		if !r.Applied || r.PolicyVersion != ch.Current.Version {
			t.Fatalf("worker %s evaluates v%d, want v%d: %+v", r.Worker, r.PolicyVersion, ch.Current.Version, r)
		}
	}
	return ch, nil
}

const noCompetitors = `
permit (principal, action in Action::"call", resource);

@id("no-mail-to-competitors")
forbid (principal, action == Action::"t.mail", resource)
when { context.input.to like "*@competitor.example" };
`

// A policy set applied to a running pool takes effect without a restart:
// the call it forbids ends POLICY_DENIED, its trail names the policy and
// the set's version, the model is told only that a policy refused it; a
// newer set put in force lets the call through again, and removing the set
// is today's behaviour.
func TestCedar_LiveChangeOnARunningPool(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	reg, err := executor.NewRegistry(cedarMailCap(&calls))
	if err != nil {
		t.Fatal(err)
	}
	w := trackedWorker(t, reg)
	trackedWorker(t, reg, capstantest.WithConn(w.Connect(t)))
	nc := w.Connect(t)
	c := w.Client(t, executor.ClientConfig{Actor: alice})
	competitor := mailIn{To: "ceo@competitor.example", Subject: "hi"}
	if env, err := c.Call(ctxT(t), "t.mail", competitor); err != nil || env.Status != envelope.StatusCompleted {
		t.Fatalf("no set in force: %v %+v", err, env)
	}

	ch, err := applyPolicies(t, nc, c, noCompetitors)
	if err != nil {
		t.Fatal(err)
	}
	if ch.Current.Version != 1 {
		t.Fatalf("first set is v%d", ch.Current.Version)
	}
	env, err := c.Call(ctxT(t), "t.mail", competitor)
	if err != nil || env.Status != envelope.StatusFailed || env.Error.Code != envelope.CodePolicyDenied {
		t.Fatalf("forbidden call: %v %+v", err, env)
	}
	if m := env.ForModel(); m.Message != "A policy refused the call." || strings.Contains(m.Message, "competitor") {
		t.Errorf("the model is shown %+v", m)
	}
	if env, err := c.Call(ctxT(t), "t.mail", mailIn{To: "a@example.com"}); err != nil || env.Status != envelope.StatusCompleted {
		t.Fatalf("a call the set permits: %v %+v", err, env)
	}
	flushAudit(t)
	evs, err := c.Trail(ctxT(t), env.ExecutionID)
	if err != nil {
		t.Fatal(err)
	}
	denied := false
	for _, ev := range evs {
		if ev.Type != audit.EventDenied {
			continue
		}
		denied = true
		if v := asInt(ev.Data["policyVersion"]); v != 1 || !strings.Contains(dataString(ev.Data["policyDecisions"]), "cedar:no-mail-to-competitors") {
			t.Errorf("denial on the trail: %+v", ev.Data)
		}
	}
	if !denied {
		t.Fatalf("no denial on the trail: %+v", evs)
	}

	if _, err := applyPolicies(t, nc, c, `permit (principal, action, resource);`); err != nil {
		t.Fatal(err)
	}
	if env, err := c.Call(ctxT(t), "t.mail", competitor); err != nil || env.Status != envelope.StatusCompleted {
		t.Fatalf("v2 permits it: %v %+v", err, env)
	}
	rm, err := policies.Remove(ctxT(t), nc, broker.NewNames(""), broker.Anonymous, "", "done")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := oplog.Confirm(ctxT(t), nc, broker.NewNames(""), oplog.Policies, rm.Revision, "", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if env, err := c.Call(ctxT(t), "t.mail", competitor); err != nil || env.Status != envelope.StatusCompleted {
		t.Fatalf("no set in force again: %v %+v", err, env)
	}
	if got := calls.Load(); got != 4 {
		t.Errorf("%d handler calls, want 4 (the forbidden one never ran)", got)
	}
}

// A set that does not parse, or does not validate against the catalog's
// schemas, is refused whole: the version in force stays, and decides.
func TestCedar_BrokenSetRefusedTheOldOneStays(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	reg, err := executor.NewRegistry(cedarMailCap(&calls))
	if err != nil {
		t.Fatal(err)
	}
	w := trackedWorker(t, reg)
	nc := w.Connect(t)
	c := w.Client(t, executor.ClientConfig{Actor: alice})
	if _, err := applyPolicies(t, nc, c, noCompetitors); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{
		`permit (principal, action, resource)`, // no semicolon
		`permit (principal, action, resource); forbid (principal, action == Action::"t.mail", resource) when { context.input.bcc == "x" };`,
		`permit (principal, action == Action::"t.mial", resource);`,
	} {
		if _, err := applyPolicies(t, nc, c, bad); err == nil {
			t.Fatalf("applied: %s", bad)
		}
	}
	kv, err := policies.Bucket(ctxT(t), testhooks.Broker(c).JS, broker.NewNames(""), false)
	if err != nil {
		t.Fatal(err)
	}
	cur, _, err := policies.ReadCurrent(ctxT(t), testhooks.Broker(c).NC, kv)
	if err != nil || cur.Version != 1 || cur.Latest != 1 {
		t.Fatalf("in force: %+v %v, want v1 alone", cur, err)
	}
	env, err := c.Call(ctxT(t), "t.mail", mailIn{To: "x@competitor.example"})
	if err != nil || env.Error == nil || env.Error.Code != envelope.CodePolicyDenied {
		t.Fatalf("v1 still decides: %v %+v", err, env)
	}
}

// Go policies run first: a call a Go policy denies never reaches Cedar;
// Cedar's deny is final even where the Go policies allow.
func TestCedar_GoPoliciesRunFirst(t *testing.T) {
	t.Parallel()
	guarded := executor.Define("t.guarded", executor.Meta{Description: "Guarded.", Expose: executor.On(executor.SurfaceDirect),
		SideEffect: executor.SideEffectNone, Policies: []executor.Policy{{Name: "go-no-bob",
			Evaluate: func(ctx context.Context, r executor.PolicyRequest) (executor.Decision, error) {
				if r.Actor.ID == "bob" {
					return executor.Decision{Stance: executor.StanceDeny, Reason: "not bob"}, nil
				}
				return executor.Decision{}, nil
			}}}},
		func(ctx context.Context, c executor.Call[struct{}]) (int, error) { return 1, nil })
	reg, err := executor.NewRegistry(guarded)
	if err != nil {
		t.Fatal(err)
	}
	w := trackedWorker(t, reg)
	nc := w.Connect(t)
	ann := w.Client(t, executor.ClientConfig{Actor: alice})
	if _, err := applyPolicies(t, nc, ann, `permit (principal, action, resource);
@id("cedar-no-alice") forbid (principal == User::"alice", action, resource);`); err != nil {
		t.Fatal(err)
	}
	bob := w.Client(t, executor.ClientConfig{Actor: envelope.Actor{Kind: "user", ID: "bob"}})
	for _, tt := range []struct {
		c      *executor.Client
		policy string
	}{{ann, "cedar:cedar-no-alice"}, {bob, "go-no-bob"}} {
		env, err := tt.c.Call(ctxT(t), "t.guarded", struct{}{})
		if err != nil || env.Error == nil || env.Error.Code != envelope.CodePolicyDenied {
			t.Fatalf("%s: %v %+v", tt.policy, err, env)
		}
		flushAudit(t)
		evs, err := tt.c.Trail(ctxT(t), env.ExecutionID)
		if err != nil {
			t.Fatal(err)
		}
		trail := ""
		for _, ev := range evs {
			if ev.Type == audit.EventDenied {
				trail = dataString(ev.Data["policyDecisions"])
			}
		}
		if !strings.Contains(trail, tt.policy) || (tt.policy == "go-no-bob" && strings.Contains(trail, "cedar")) {
			t.Errorf("denial of %s: %s", tt.policy, trail)
		}
	}
}

// dataString renders a trail's data value for a search.
func dataString(v any) string {
	var b strings.Builder
	var walk func(any)
	walk = func(v any) {
		switch x := v.(type) {
		case []any:
			for _, e := range x {
				walk(e)
			}
		case map[string]any:
			for k, e := range x {
				b.WriteString(k + "=")
				walk(e)
				b.WriteString(" ")
			}
		default:
			fmt.Fprint(&b, x)
		}
	}
	walk(v)
	return b.String()
}

// A policy set put in force while an execution's attempt runs refuses its
// retry as it refuses a new call: an operator's rule applies to attempts
// not yet started, not only to calls not yet admitted. The attempt that ran
// is said to have run; a set that does not forbid the call lets the retry
// through.
func TestCedar_ASetPutInForceBeforeARetryDecidesIt(t *testing.T) {
	t.Parallel()
	for _, forbids := range []bool{true, false} {
		t.Run(fmt.Sprintf("forbids=%v", forbids), func(t *testing.T) {
			t.Parallel()
			r := newRetryRig(t)
			calls, applied, nc, c := &r.calls, r.applied, r.nc, r.c
			// Admitted under a set that permits it.
			if _, err := applyPolicies(t, nc, c, `permit (principal, action, resource);`); err != nil {
				t.Fatal(err)
			}
			id := r.submit(t)
			set := `permit (principal, action, resource);`
			if forbids {
				set += `
@id("no-reservations")
forbid (principal, action == Action::"t.reserve", resource);`
			}
			if _, err := applyPolicies(t, nc, c, set); err != nil {
				t.Fatal(err)
			}
			close(applied)
			env, err := c.Await(ctxT(t), id)
			if err != nil {
				t.Fatal(err)
			}
			if !forbids {
				if env.Status != envelope.StatusCompleted || env.Attempts != 2 || calls.Load() != 2 {
					t.Fatalf("a set that permits the call: %+v after %d calls", env, calls.Load())
				}
				return
			}
			if env.Status != envelope.StatusFailed || env.Error.Code != envelope.CodePolicyDenied || env.Attempts != 1 || calls.Load() != 1 {
				t.Fatalf("the retry under a set that forbids it: %+v %+v after %d calls", env, env.Error, calls.Load())
			}
			flushAudit(t)
			evs, err := c.Trail(ctxT(t), id)
			if err != nil {
				t.Fatal(err)
			}
			var types []string
			for _, ev := range evs {
				types = append(types, ev.Type)
				switch ev.Type {
				case audit.EventDenied:
					// The set in force decided, alone: the earlier set's
					// allow no longer stands beside it.
					if d := dataString(ev.Data["policyDecisions"]); asInt(ev.Data["policyVersion"]) != 2 ||
						!strings.Contains(d, "cedar:no-reservations") || strings.Count(d, "cedar") != 1 {
						t.Errorf("denial on the trail: %+v", ev.Data)
					}
				case audit.EventFailed:
					if ev.Data["executedBeforeFailure"] != true {
						t.Errorf("failed %+v: the first attempt ran", ev.Data)
					}
				}
			}
			if want := []string{audit.EventStarted, audit.EventDenied, audit.EventFailed}; !containsInOrder(types, want) {
				t.Errorf("trail %v, want %v in order and no retry", types, want)
			}
			if slices.Contains(types, audit.EventRetried) {
				t.Errorf("trail %v files a retry that never ran", types)
			}
		})
	}
}

// retryRig is t.reserve, an idempotent write retried once, on a worker of
// its own, with alice's client: its first attempt fails, retryably, once
// the test closes applied (a policy set or pause put in force meanwhile);
// the retry reserves.
type retryRig struct {
	calls   atomic.Int64
	first   chan struct{} // closed as the first attempt runs
	applied chan struct{}
	nc      *nats.Conn
	c       *executor.Client
}

func newRetryRig(t *testing.T) *retryRig {
	t.Helper()
	r := &retryRig{first: make(chan struct{}), applied: make(chan struct{})}
	reg, err := executor.NewRegistry(executor.Define("t.reserve", executor.Meta{Description: "Reserves stock; fails once.",
		Expose: executor.On(executor.SurfaceDirect), SideEffect: executor.SideEffectWrite, Idempotent: true,
		Retry: &executor.Retry{MaxAttempts: 1, Backoff: 10 * time.Millisecond}},
		func(ctx context.Context, c executor.Call[mailIn]) (string, error) {
			if r.calls.Add(1) == 1 {
				close(r.first)
				<-r.applied
				return "", executor.Retryable("The warehouse did not answer.")
			}
			return "reserved", nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	w := trackedWorker(t, reg)
	r.nc, r.c = w.Connect(t), w.Client(t, executor.ClientConfig{Actor: alice})
	return r
}

// submit calls t.reserve and returns once its first attempt runs.
func (r *retryRig) submit(t *testing.T) string {
	t.Helper()
	id, err := r.c.Submit(ctxT(t), "t.reserve", mailIn{To: "a@example.com"})
	if err != nil {
		t.Fatal(err)
	}
	<-r.first
	return id
}

// containsInOrder reports whether want appears in got in its order, not
// necessarily side by side.
func containsInOrder(got, want []string) bool {
	i := 0
	for _, g := range got {
		if i < len(want) && g == want[i] {
			i++
		}
	}
	return i == len(want)
}

// A takeover's retry of an attempt lost with its worker is decided by the
// policy set in force as a new call is: one that forbids the call refuses
// the retry, and the handler is not called again.
func TestCedar_ATakeoversRetryIsDecidedByTheSetInForce(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	s := newStore(t, env)
	var p probe
	startWorker(t, env.Connect(t), executor.WorkerConfig{ID: "live-worker", Lease: 2 * time.Second}, lookupCap(&p))
	if _, err := applyPolicies(t, s.nc, s.c, `permit (principal, action, resource);
@id("no-lookups")
forbid (principal, action == Action::"test.lookup", resource);`); err != nil {
		t.Fatal(err)
	}
	id := envelope.NewExecutionID()
	s.putRecord(&execution.Record{ExecutionID: id, CapabilityID: "test.lookup", State: execution.StateRunning, Attempt: 1,
		Worker: deadWorker, LeaseUntil: pastLease(), StartedAt: pastLease()})
	s.publish("test.lookup", id)
	got := s.await(id)
	checkTakeover(t, takeover{status: envelope.StatusFailed, code: envelope.CodePolicyDenied, attempts: 1,
		takenFrom: execution.StateRunning}, got, s.settled(id), &p)
}

// A current policy key that no worker can read, put while an execution
// admitted with no set in force runs, fails its retry closed as it fails a
// new call: the broken set is not the absence of a set that admitted it.
func TestCedar_ABrokenSetPutInForceBeforeARetryFailsItClosed(t *testing.T) {
	t.Parallel()
	r := newRetryRig(t)
	calls, applied, nc, c := &r.calls, r.applied, r.nc, r.c
	id := r.submit(t) // admitted with no set in force
	kv, err := policies.Bucket(ctxT(t), testhooks.Broker(c).JS, broker.NewNames(""), true)
	if err != nil {
		t.Fatal(err)
	}
	rev, err := kv.Put(ctxT(t), "current", []byte(`{"version":"seven"`))
	if err != nil {
		t.Fatal(err)
	}
	replies, err := oplog.Confirm(ctxT(t), nc, broker.NewNames(""), oplog.Policies, rev, "", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range replies {
		if !r.Applied || r.PolicyError == "" {
			t.Fatalf("worker %s does not hold the broken set: %+v", r.Worker, r)
		}
	}
	close(applied)
	env, err := c.Await(ctxT(t), id)
	if err != nil {
		t.Fatal(err)
	}
	if env.Status != envelope.StatusFailed || env.Error == nil || env.Error.Code != envelope.CodePolicyFailed || calls.Load() != 1 {
		t.Fatalf("the retry under a set that cannot be read: %+v %+v after %d calls, want POLICY_FAILED after 1",
			env, env.Error, calls.Load())
	}
}
