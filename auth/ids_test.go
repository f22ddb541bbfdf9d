package auth_test

import (
	"slices"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
)

// publishAs publishes a request as nc's principal (on its own exec subject,
// all its credentials allow) with the message id msgID.
func publishAs(t *testing.T, nc *nats.Conn, principal, capabilityID, executionID, msgID string, input any) {
	t.Helper()
	raw, err := envelope.NewRaw(input)
	if err != nil {
		t.Fatal(err)
	}
	body, err := envelope.Marshal(&envelope.Request{V: envelope.Version, ExecutionID: executionID, CapabilityID: capabilityID,
		Input: raw, Actor: envelope.Actor{Kind: envelope.ActorUser, ID: principal}, Surface: "direct"})
	if err != nil {
		t.Fatal(err)
	}
	m := nats.NewMsg(broker.NewNames("").ExecSubject(principal, capabilityID))
	m.Data = body
	m.Header.Set(nats.MsgIdHdr, msgID)
	if _, err := broker.PublishAck(testCtx(t), nc, m); err != nil {
		t.Fatalf("publish as %s: %v", principal, err)
	}
}

// An execution id is bob's alone, whoever knows it first. alice, with her
// real credentials, takes bob's caller-chosen id under her own principal, and
// publishes under it with the message ids bob's requests would carry (his
// key, with and without a guessed tag), before bob calls: bob's call still
// runs once and completes with his own output, alice's forgeries are refused
// before they run, and nothing of hers is on bob's trail or under his key.
func TestIDs_ScopedByPrincipal_NoSquattingNoTrailPollution(t *testing.T) {
	t.Parallel()
	r := newRig(t, false)
	alice, aliceNC, _ := r.client(t, "alice", executor.SurfaceDirect)
	bob, _, _ := r.client(t, "bob", executor.SurfaceDirect)
	const id = "order-4711-mail"

	// alice's own execution under bob's id: hers, not his.
	env, err := alice.Call(testCtx(t), "t.send", Echo{Text: "from alice"}, executor.WithID(id))
	if err != nil || env.Status != envelope.StatusCompleted {
		t.Fatalf("alice's own call: %v %+v", err, env)
	}
	// Then her forgeries: a request of hers whose message id names bob's
	// execution, as bob's client makes it, and with a guessed tag.
	for _, msgID := range []string{broker.Key("bob", id), broker.Key("bob", id) + ".0000000000000000", id + "x"} {
		publishAs(t, aliceNC, "alice", "t.send", id, msgID, Echo{Text: "FORGED BY ALICE"})
	}
	if n := r.sends.Load(); n != 1 {
		t.Fatalf("after alice's call and forgeries the handler ran %d times, want 1", n)
	}

	env, err = bob.Call(testCtx(t), "t.send", Echo{Text: "from bob"}, executor.WithID(id))
	if err != nil {
		t.Fatalf("bob's call: %v", err)
	}
	if env.Status != envelope.StatusCompleted || string(env.Output) == "" {
		t.Fatalf("bob's call: %+v", env)
	}
	if n := r.sends.Load(); n != 2 {
		t.Fatalf("the handler ran %d times, want 2: alice's call and bob's", n)
	}
	r.settled(t, "bob", id)

	trail, err := audit.Read(testCtx(t), r.admin, "bob", id)
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	for _, ev := range trail {
		if ev.Principal != "bob" || ev.Actor.ID != "bob" {
			t.Errorf("bob's trail holds an event of %s (actor %s): %s", ev.Principal, ev.Actor.ID, ev.Type)
		}
		types = append(types, ev.Type)
	}
	if slices.Contains(types, audit.EventDuplicateDelivery) || types[len(types)-1] != audit.EventCompleted {
		t.Errorf("bob's trail %v: want his own execution, completed", types)
	}
	// alice's forgeries ended on her own execution, never on bob's: hers
	// stays the one completed envelope she got.
	st, err := alice.Status(testCtx(t), id)
	if err != nil || st.Envelope == nil || st.Envelope.Status != envelope.StatusCompleted {
		t.Fatalf("alice's execution: %v %+v", err, st)
	}
}

// A request whose message id does not name its own execution is refused
// before it runs; with nothing else under its id, it ends INPUT_INVALID.
func TestIDs_MessageIDNamingAnotherExecution_RefusedBeforeItRuns(t *testing.T) {
	t.Parallel()
	r := newRig(t, false)
	alice, aliceNC, _ := r.client(t, "alice", executor.SurfaceDirect)
	id := envelope.NewExecutionID()
	publishAs(t, aliceNC, "alice", "t.send", id, broker.Key("bob", id), Echo{Text: "x"})
	env, err := alice.Await(testCtx(t), id)
	if err != nil {
		t.Fatal(err)
	}
	if env.Status != envelope.StatusFailed || env.Error.Code != envelope.CodeInputInvalid {
		t.Fatalf("envelope %s %+v, want INPUT_INVALID", env.Status, env.Error)
	}
	if n := r.sends.Load(); n != 0 {
		t.Fatalf("the handler ran %d times", n)
	}
}
