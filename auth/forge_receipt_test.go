package auth_test

import (
	"testing"
	"time"

	"github.com/capstan-dev/capstan/execution"

	"github.com/nats-io/nats.go"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
)

// A receipt finalizes a lost attempt completed without running it again
// (DESIGN §5): a producer who could write one would get "completed" for an
// effect that never happened, or hide one that did. Only the worker holding
// the attempt's claim writes it, on the execution's record, which producers
// may not write: alice, with her real credentials, puts a record carrying a
// forged receipt where her next execution's record goes, and on her running
// execution's record, by every way a client writes a bucket. The server
// refuses each write, nothing changes, the first execution runs its handler
// and returns its own output, and the second ends as its cancel says, not
// completed from a receipt.
func TestForge_ReceiptInTheRecordIsRefused(t *testing.T) {
	t.Parallel()
	r := newRig(t, false)
	ctx := testCtx(t)
	alice, aliceNC, v := r.client(t, "alice", executor.SurfaceDirect)
	n := r.setup.Names()
	forge := func(id string, before world) {
		t.Helper()
		rec, err := envelope.Marshal(&execution.Record{V: envelope.Version, ExecutionID: id, CapabilityID: "t.send",
			State: execution.StateRunning, Attempt: 1, Worker: "ghost", Claim: "forged", LeaseUntil: time.Now().Add(-time.Hour),
			StartedAt: time.Now().Add(-time.Hour), Actor: "user:alice", Surface: "direct",
			Receipt: envelope.MustRaw("forged"), ReceiptAttempt: 1, ReceiptAt: time.Now()})
		if err != nil {
			t.Fatal(err)
		}
		key := "$KV." + n.ExecutionsBucket() + "." + broker.Key("alice", id)
		for _, m := range []*nats.Msg{
			{Subject: key, Data: rec},
			// A compare-and-swap on whatever revision is there, as a worker writes.
			{Subject: key, Data: rec, Header: nats.Header{"Nats-Expected-Last-Subject-Sequence": []string{"0"}}},
			{Subject: "$JS.API.STREAM.MSG.DELETE.KV_" + n.ExecutionsBucket(), Data: []byte(`{"seq":1}`)},
		} {
			if err := aliceNC.PublishMsg(m); err != nil {
				t.Fatal(err)
			}
			v.wait(t, ctx, m.Subject)
		}
		r.assertUnchanged(t, before)
	}

	// Before the execution: its takeover would have completed from the receipt.
	id := envelope.NewExecutionID()
	forge(id, r.snapshot(t))
	env, err := alice.Call(ctx, "t.send", Echo{Text: "once"}, executor.WithID(id))
	if err != nil {
		t.Fatal(err)
	}
	var out string
	if err := env.Output.Decode(&out); err != nil || out != "sent" || env.Recovered != nil || r.sends.Load() != 1 {
		t.Fatalf("envelope %s %q (%v) recovered %+v after %d sends: want the handler's own output", env.Status, out, err,
			env.Recovered, r.sends.Load())
	}

	// While it runs: a cancel after a receipt would end it completed. The
	// first execution is settled and acknowledged first: the world read
	// around the attack must not see it end.
	r.settled(t, "alice", id)
	r.acked(t, "alice")
	held, err := alice.Submit(ctx, "t.send", Echo{Text: "hold"})
	if err != nil {
		t.Fatal(err)
	}
	r.trail(t, held, "capability.started")
	forge(held, r.snapshot(t))
	if _, err := alice.Cancel(ctx, held); err != nil {
		t.Fatal(err)
	}
	env, err = alice.Await(ctx, held)
	if err != nil || env.Status != envelope.StatusCancelled || env.Recovered != nil {
		t.Fatalf("held execution: %v %+v, want cancelled, not recovered", err, env)
	}
	if events := r.trail(t, held, "capability.cancelled"); len(events) == 0 {
		t.Fatal("no trail")
	} else {
		for _, e := range events {
			if e == "capability.receipt_recorded" {
				t.Fatalf("trail %v records a receipt", events)
			}
		}
	}
}
