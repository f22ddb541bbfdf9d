package executor_test

import (
	"io"
	"net/http/httptest"
	"regexp"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/capstantest"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/oplog"
	"github.com/capstan-dev/capstan/internal/pauses"
	"github.com/capstan-dev/capstan/telemetry"
)

// Every pause, unpause and policy set put in force is an audit event with
// who (the principal, and the person at the keyboard as the actor), why and,
// for a policy set, its version;
// and the worker's metrics count the calls a pause held and refused.
func TestOperators_ChangesOnTheTrailWithWhoAndWhy_PausedCallsCounted(t *testing.T) {
	t.Parallel()
	var sends atomic.Int64
	reg, err := executor.NewRegistry(countedCap("t.send", &sends, nil))
	if err != nil {
		t.Fatal(err)
	}
	tel := telemetry.New(telemetry.Options{})
	w := trackedWorker(t, reg, capstantest.WithConfig(executor.WorkerConfig{Observer: tel.Worker()}))
	nc := w.Connect(t)
	c := w.Client(t, executor.ClientConfig{Actor: alice})
	n := broker.NewNames("")

	// A hold, met by a call; then a refusal, replacing it, which ends the
	// held call too when it comes back; then the lift.
	hold, err := pauses.Apply(ctxT(t), nc, n, &pauses.Pause{Scope: pauses.Scope{Capability: "t.send"}, Mode: pauses.Hold,
		Reason: "mail to the wrong list", By: broker.Anonymous, Operator: "ana"})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := oplog.Confirm(ctxT(t), nc, n, oplog.Pauses, hold.Revision, "", 5*time.Second); err != nil || len(r) != 1 || !r[0].Applied {
		t.Fatalf("the hold not applied: %v %+v", err, r)
	}
	id, err := c.Submit(ctxT(t), "t.send", map[string]int{"n": 1})
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the call held", func() bool { return w.Stats().Held >= 1 })
	refuse, _ := pause(t, nc, pauses.Pause{Scope: pauses.Scope{Capability: "t.send"}, Mode: pauses.Refuse, Reason: "stop it"})
	if env, err := c.Call(ctxT(t), "t.send", map[string]int{"n": 2}); err != nil || env.Error == nil || env.Error.Code != envelope.CodePaused {
		t.Fatalf("a call while refused: %v %+v", err, env)
	}
	if env, err := c.Await(ctxT(t), id); err != nil || env.Error == nil || env.Error.Code != envelope.CodePaused {
		t.Fatalf("the held call, back under the refusal: %v %+v", err, env)
	}
	lift, err := pauses.Lift(ctxT(t), nc, n, pauses.Scope{Capability: "t.send"}, broker.Anonymous, "ben", "list fixed")
	if err != nil {
		t.Fatal(err)
	}
	if got := sends.Load(); got != 0 {
		t.Fatalf("%d handler calls", got)
	}

	applied, err := applyPolicies(t, nc, c, "permit (principal, action in Action::\"call\", resource);")
	if err != nil {
		t.Fatal(err)
	}

	flushAudit(t)
	evs, err := c.Trail(ctxT(t), applied.AuditID)
	if err != nil || len(evs) != 1 || evs[0].Type != audit.EventPoliciesApplied || asInt(evs[0].Data["version"]) != 1 ||
		evs[0].Data["reason"] != "testing" || evs[0].Principal != broker.Anonymous {
		t.Fatalf("the policy set's event: %v %+v", err, evs)
	}
	for _, want := range []struct {
		id, typ, operator, reason string
	}{
		{hold.AuditID, audit.EventPaused, "ana", "mail to the wrong list"},
		{refuse.AuditID, audit.EventPaused, "", "stop it"},
		{lift.AuditID, audit.EventUnpaused, "ben", "list fixed"},
	} {
		evs, err := c.Trail(ctxT(t), want.id)
		if err != nil || len(evs) != 1 {
			t.Fatalf("trail of %s: %v %+v", want.id, err, evs)
		}
		ev := evs[0]
		actor := audit.Actor{Kind: envelope.ActorUser, ID: want.operator}
		if want.operator == "" {
			actor = audit.Actor{Kind: envelope.ActorService, ID: broker.Anonymous}
		}
		if ev.Type != want.typ || ev.Principal != broker.Anonymous || ev.Actor != actor || ev.Data["reason"] != want.reason ||
			ev.CapabilityID != "t.send" {
			t.Errorf("event %s: %+v, want %s by %+v: %q", want.id, ev, want.typ, actor, want.reason)
		}
	}

	// Held and refused, as the metrics say.
	srv := httptest.NewServer(tel.Handler())
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	for _, action := range []string{"held", "refused"} {
		m := regexp.MustCompile(`capstan_paused_total\{action="` + action + `",capability="t.send"[^}]*\} (\d+)`).FindSubmatch(body)
		if m == nil {
			t.Fatalf("no capstan_paused_total of %s calls in\n%s", action, body)
		}
		if v, _ := strconv.Atoi(string(m[1])); v < 1 {
			t.Errorf("capstan_paused_total{action=%q} = %d", action, v)
		}
	}
}
