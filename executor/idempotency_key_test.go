package executor_test

import (
	"sort"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/execution"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/demo"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// The idempotency key is the principal's and the execution id's together
// (DESIGN §6); a new execution's record names that derivation, and an
// execution keeps the key its record names for its whole life. An execution
// begun by an earlier version — its record names no derivation — is taken
// over, reconciled and retried by this version under the key of its id alone,
// the one its lost attempt used: the effect it left is found where it is, and
// never made a second time under another key (rule A).
func TestIdempotencyKey_ExecutionBegunByAnEarlierVersionKeepsItsKey(t *testing.T) {
	t.Parallel()
	refund := map[string]any{"orderId": "o-7", "amount": 120}
	email := map[string]any{"to": "ops@example.com", "subject": "hello"}
	cases := []struct {
		name       string
		capability string
		input      map[string]any
		// version is the key derivation the record names (0: none, an
		// earlier version's record); state the lost attempt's.
		version int
		state   execution.State
		// want: the envelope, how it was recovered ("" none), the handler
		// calls this version made.
		recovered string
		calls     int
		repeated  bool
	}{
		{name: "Refund_ReconciledUnderTheIDAloneKey", capability: "orders.refund", input: refund,
			state: execution.StateRunning, recovered: envelope.RecoveredByReconciler},
		{name: "Email_ReconciledUnderTheIDAloneKey", capability: "email.send", input: email,
			state: execution.StateRunning, recovered: envelope.RecoveredByReconciler},
		// A retry of an attempt that failed after its effect: the handler is
		// given the id-alone key and finds its own refund.
		{name: "Refund_RetriedUnderTheIDAloneKey", capability: "orders.refund", input: refund,
			state: execution.StateBackoff, calls: 1, repeated: true},
		// This version's records name their derivation: the same takeover
		// looks the principal's key up.
		{name: "Refund_ThisVersionsRecord", capability: "orders.refund", input: refund, version: envelope.IdempotencyKeyVersion,
			state: execution.StateRunning, recovered: envelope.RecoveredByReconciler},
		{name: "Email_ThisVersionsRecord", capability: "email.send", input: email, version: envelope.IdempotencyKeyVersion,
			state: execution.StateRunning, recovered: envelope.RecoveredByReconciler},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			env := testenv.Start(t)
			s := newStore(t, env)
			nc := env.Connect(t)
			js, err := demo.Provision(ctxT(t), nc, 1)
			if err != nil {
				t.Fatal(err)
			}
			id := envelope.NewExecutionID()
			key := envelope.IdempotencyKeyOf(tc.version, broker.Anonymous, id)
			// The lost attempt's effect, where it lives, under the key it used.
			putEffect(t, js, tc.capability, id, key, tc.input)
			lost := &execution.Record{ExecutionID: id, CapabilityID: tc.capability, State: tc.state, Attempt: 1,
				Worker: deadWorker, LeaseUntil: pastLease(), StartedAt: pastLease(), KeyVersion: tc.version}
			if tc.state == execution.StateBackoff {
				lost.LastError = envelope.CodeExecutionFailed
			}
			s.putRecordAsIs(lost)
			s.publishRequest(s.b.Names.ExecSubject(broker.Anonymous, tc.capability),
				&envelope.Request{ExecutionID: id, CapabilityID: tc.capability, Input: envelope.MustRaw(tc.input)})
			startWorker(t, nc, executor.WorkerConfig{ID: "upgraded", Lease: 2 * time.Second}, demo.Catalog(js)...)

			got := s.await(id)
			if got.Status != envelope.StatusCompleted {
				t.Fatalf("envelope %s %+v, want completed", got.Status, got.Error)
			}
			switch {
			case tc.recovered == "" && got.Recovered != nil, tc.recovered != "" && (got.Recovered == nil || got.Recovered.How != tc.recovered):
				t.Errorf("recovered %+v, want %q", got.Recovered, tc.recovered)
			}
			if tc.repeated {
				var out demo.RefundOutput
				if err := got.Output.Decode(&out); err != nil || !out.Repeated {
					t.Errorf("output %+v (%v): the retry did not find the lost attempt's refund", out, err)
				}
			}
			calls, err := demo.ReadCalls(ctxT(t), js)
			if err != nil {
				t.Fatal(err)
			}
			if len(calls) != tc.calls {
				t.Errorf("handler called %d times, want %d", len(calls), tc.calls)
			}
			// One effect, under the key the execution began with.
			if keys := effectKeys(t, js, tc.capability); len(keys) != 1 || keys[0] != key {
				t.Errorf("effects under %v, want only %s", keys, key)
			}
			if rec, _ := s.record(id); rec.KeyVersion != tc.version {
				t.Errorf("the record names key version %d, want %d as it was created", rec.KeyVersion, tc.version)
			}
			if _, ok := find(s.settled(id), audit.EventTakenOver); !ok {
				t.Error("no takeover in the trail")
			}
		})
	}
}

// A new execution's record names this version's derivation, and its handler
// is given the principal's key.
func TestIdempotencyKey_NewExecutionNamesThisVersionsKey(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	s := newStore(t, env)
	nc := env.Connect(t)
	js, err := demo.Provision(ctxT(t), nc, 1)
	if err != nil {
		t.Fatal(err)
	}
	startWorker(t, nc, executor.WorkerConfig{}, demo.Catalog(js)...)
	got, err := s.c.Call(ctxT(t), "orders.refund", map[string]any{"orderId": "o-1", "amount": 10}, executor.WithID("refund-42"))
	if err != nil || got.Status != envelope.StatusCompleted {
		t.Fatalf("%v %+v", err, got)
	}
	if rec, _ := s.record("refund-42"); rec.KeyVersion != envelope.IdempotencyKeyVersion {
		t.Errorf("record names key version %d, want %d", rec.KeyVersion, envelope.IdempotencyKeyVersion)
	}
	want := envelope.IdempotencyKey(broker.Anonymous, "refund-42")
	if keys := effectKeys(t, js, "orders.refund"); len(keys) != 1 || keys[0] != want {
		t.Errorf("refunds under %v, want %s", keys, want)
	}
}

// putEffect stores the effect a lost attempt of capability made under key.
func putEffect(t *testing.T, js jetstream.JetStream, capability, id, key string, input map[string]any) {
	t.Helper()
	ctx := ctxT(t)
	switch capability {
	case "orders.refund":
		kv, err := js.KeyValue(ctx, demo.RefundsBucket)
		if err != nil {
			t.Fatal(err)
		}
		in := demo.RefundInput{OrderID: input["orderId"].(string), Amount: int64(input["amount"].(int))}
		b, err := envelope.Marshal(in)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Create(ctx, key, b); err != nil {
			t.Fatal(err)
		}
	case "email.send":
		m := nats.NewMsg(demo.OutboxSubject + "." + key)
		m.Header.Set(demo.ExecutionIDHeader, id)
		m.Header.Set(demo.IdempotencyKeyHeader, key)
		m.Data = []byte(input["to"].(string) + "\n" + input["subject"].(string))
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	default:
		t.Fatalf("no effect store for %s", capability)
	}
}

// effectKeys lists the keys capability's effects are stored under.
func effectKeys(t *testing.T, js jetstream.JetStream, capability string) []string {
	t.Helper()
	ctx := ctxT(t)
	var keys []string
	switch capability {
	case "orders.refund":
		kv, err := js.KeyValue(ctx, demo.RefundsBucket)
		if err != nil {
			t.Fatal(err)
		}
		l, err := kv.ListKeys(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for k := range l.Keys() {
			keys = append(keys, k)
		}
	case "email.send":
		s, err := js.Stream(ctx, demo.OutboxStream)
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(ctx, jetstream.WithSubjectFilter(demo.OutboxSubject+".>"))
		if err != nil {
			t.Fatal(err)
		}
		for subject, n := range info.State.Subjects {
			for range n {
				keys = append(keys, subject[len(demo.OutboxSubject)+1:])
			}
		}
	}
	sort.Strings(keys)
	return keys
}
