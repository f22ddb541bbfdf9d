package audit_test

import (
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/auditemit"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// as is event, filed by principal.
func as(principal, typ, executionID string) *audit.Event {
	ev := event(typ, executionID)
	ev.Principal = principal
	return ev
}

func byPrincipal(trail []audit.Event) string {
	var out []string
	for _, ev := range trail {
		out = append(out, ev.Principal+":"+ev.Type)
	}
	return fmt.Sprint(out)
}

// Executions are scoped by principal: two principals' executions under one id
// have two trails, and neither reads or follows the other's events as its own.
func TestTrail_ScopedByPrincipal_AnotherPrincipalsEventsUnderTheSameIDAreNotPartOfIt(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	b := provision(t, env.Connect(t), broker.Config{})
	e := newEmitter(t, b, auditemit.Options{})
	id := envelope.NewExecutionID()
	e.Emit(as("bob", audit.EventRequested, id))
	e.EmitAll(as("alice", audit.EventRequested, id), as("alice", audit.EventFailed, id))
	e.EmitAll(as("bob", audit.EventStarted, id), as("bob", audit.EventCompleted, id))
	flush(t, e)

	for principal, want := range map[string]string{
		"alice": "[alice:capability.requested alice:capability.failed]",
		"bob":   "[bob:capability.requested bob:capability.started bob:capability.completed]",
	} {
		trail, err := audit.Read(testCtx(t), b.NC, b.Names.Prefix(), principal, id)
		if err != nil {
			t.Fatal(err)
		}
		if got := byPrincipal(trail); got != want {
			t.Errorf("Read as %s: %s, want %s", principal, got, want)
		}
		followed := collect(t, b, audit.Filter{Principal: principal, ExecutionID: id}, len(trail), audit.FromStart())
		if got := byPrincipal(followed); got != want {
			t.Errorf("Follow as %s: %s, want %s", principal, got, want)
		}
	}
	if _, err := audit.Read(testCtx(t), b.NC, b.Names.Prefix(), "carol", id); err == nil {
		t.Error("carol has a trail under an id only alice and bob used")
	}
}

// Stores of earlier versions kept an execution's events on the shard of its
// id alone, named by the Capstan-Execution-Id header: they are still read, as
// the trail of the principal their events name.
func TestRead_StoresBeforePrincipalScopedIDs(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	b := provision(t, env.Connect(t), broker.Config{})
	id := envelope.NewExecutionID()
	for _, ev := range []*audit.Event{as("alice", audit.EventRequested, id), as("alice", audit.EventCompleted, id), as("bob", audit.EventRequested, id)} {
		ev.V = envelope.Version
		data, err := envelope.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		m := &nats.Msg{Subject: b.Names.AuditSubject(id), Data: data,
			Header: nats.Header{broker.LegacyAuditExecutionHeader: []string{id}}}
		if _, err := b.JS.PublishMsg(testCtx(t), m); err != nil {
			t.Fatal(err)
		}
	}
	trail, err := audit.Read(testCtx(t), b.NC, b.Names.Prefix(), "alice", id)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := byPrincipal(trail), "[alice:capability.requested alice:capability.completed]"; got != want {
		t.Errorf("Read: %s, want %s", got, want)
	}
	followed := collect(t, b, audit.Filter{Principal: "bob", ExecutionID: id}, 1, audit.FromStart())
	if got, want := byPrincipal(followed), "[bob:capability.requested]"; got != want {
		t.Errorf("Follow: %s, want %s", got, want)
	}
}
