package executor_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/auth"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
)

// Reads without claims of two principals on one secured server: alice's
// flood of long reads leaves bob his share of the worker's slots, and bob,
// with his own credentials, can neither read, cancel nor take over any of
// alice's reads — not by asking under their ids, not by sending his own
// request under one of them, not by aiming the server's acknowledgement of
// his publication at the cancel notice of one. Every read of alice's ends
// completed, once.
func TestReads_TwoPrincipals_AFloodNeitherStarvesNorRevealsTheOther(t *testing.T) {
	t.Parallel()
	env, admin := secured(t,
		auth.Grant{Principal: "alice", Role: auth.RoleProducer, Actors: []string{"user:alice"}, Capabilities: []string{"*"}},
		auth.Grant{Principal: "bob", Role: auth.RoleProducer, Actors: []string{"user:bob"}, Capabilities: []string{"*"}})
	var aliceCalls, bobCalls atomic.Int64
	release := make(chan struct{})
	startWorker(t, env.ConnectAs(t, auth.WorkerPrincipal), executor.WorkerConfig{Concurrency: 8},
		executor.Define("t.read", executor.Meta{Description: "Reads; alice's wait.", Expose: executor.On(executor.SurfaceDirect),
			SideEffect: executor.SideEffectRead, Idempotent: true, Timeout: 10 * time.Minute},
			func(ctx context.Context, c executor.Call[echoIn]) (echoIn, error) {
				if c.Principal != "alice" {
					bobCalls.Add(1)
					return c.Input, nil
				}
				aliceCalls.Add(1)
				select {
				case <-release:
					return c.Input, nil
				case <-ctx.Done():
					return echoIn{}, ctx.Err()
				}
			}))
	clientOf := func(p string) *executor.Client {
		c, err := executor.NewClient(env.ConnectAs(t, p), executor.ClientConfig{Actor: envelope.Actor{Kind: "user", ID: p}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	alice, bob := clientOf("alice"), clientOf("bob")
	bobCall := func(opts ...executor.CallOption) *envelope.Envelope {
		t.Helper()
		got, err := bob.Call(ctxT(t), "t.read", echoIn{Hello: "bob's"}, opts...)
		if err != nil || got.Status != envelope.StatusCompleted {
			t.Fatalf("bob's read: %+v %v", got, err)
		}
		return got
	}
	bobCall() // bob is active

	var ids []string
	for range 20 {
		id, err := alice.Submit(ctxT(t), "t.read", echoIn{Hello: "alice's"})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	waitUntil(t, "alice's reads hold their share of the slots", func() bool { return aliceCalls.Load() == 7 })
	bobCall() // not starved: the reserve slot is his
	target := ids[0]
	// His own request under her id is his execution, not hers.
	if got := bobCall(executor.WithID(target)); got.ExecutionID != target {
		t.Fatalf("bob's read under alice's id: %+v", got)
	}
	// The acknowledgement of a publication of his, aimed at the cancel
	// notice of one of hers: it goes back to his own account.
	bobConn := env.ConnectAs(t, "bob")
	aimed := nats.NewMsg(admin.Names.ExecSubject("bob", "t.read"))
	aimed.Reply = admin.Names.CancelNoticeSubject("alice", ids[1])
	aimedID := envelope.NewExecutionID()
	aimed.Header.Set(jetstream.MsgIDHeader, broker.Key("bob", aimedID))
	var err error
	aimed.Data, err = envelope.Marshal(&envelope.Request{V: envelope.Version, ExecutionID: aimedID, CapabilityID: "t.read",
		Input: envelope.MustRaw(echoIn{Hello: "aimed"}), Actor: envelope.Actor{Kind: "user", ID: "bob"},
		Surface: string(executor.SurfaceDirect), SubmittedAt: time.Now().UTC()})
	if err != nil {
		t.Fatal(err)
	}
	if err := bobConn.PublishMsg(aimed); err != nil {
		t.Fatal(err)
	}
	if got, err := bob.Await(ctxT(t), aimedID); err != nil || got.Status != envelope.StatusCompleted {
		t.Fatalf("bob's aimed read: %+v %v", got, err)
	}

	// Nothing of hers reads or cancels as his.
	if v, err := requestExecution(ctxT(t), bobConn, admin.Names, executor.ExecutionRequest{ExecutionID: ids[2]}); !errors.Is(err, executor.ErrNoSuchExecution) {
		t.Errorf("bob reads alice's running read: %+v %v", v, err)
	}
	if v, err := requestExecution(ctxT(t), bobConn, admin.Names, executor.ExecutionRequest{ExecutionID: ids[2], Owner: "alice"}); !errors.Is(err, executor.ErrNotAllowed) {
		t.Errorf("bob reads alice's running read naming her: %+v %v", v, err)
	}
	// A cancel under her id is of his own execution of it (none, or one
	// on its way): hers runs on, as its end below shows.
	if _, err := bob.Cancel(ctxT(t), ids[2]); err != nil && !errors.Is(err, executor.ErrNoSuchExecution) {
		t.Fatal(err)
	}
	if reply, err := bob.Cancel(ctxT(t), ids[2], executor.OwnedBy("alice")); err == nil && reply.Error == "" {
		t.Errorf("bob's cancel of alice's running read naming her: %+v", reply)
	}

	close(release)
	for _, id := range ids {
		got, err := alice.Await(ctxT(t), id)
		if err != nil || got.Status != envelope.StatusCompleted || got.Attempts != 1 {
			t.Fatalf("alice's read %s: %+v %v", id, got, err)
		}
		var out echoIn
		if err := got.Output.Decode(&out); err != nil || out.Hello != "alice's" {
			t.Errorf("alice's read %s answered %+v (%v)", id, out, err)
		}
	}
	if aliceCalls.Load() != 20 {
		t.Errorf("%d handler calls of alice's 20 reads", aliceCalls.Load())
	}
	flushAudit(t)
	v, err := requestExecution(ctxT(t), env.ConnectAs(t, "alice"), admin.Names, executor.ExecutionRequest{ExecutionID: target})
	if err != nil {
		t.Fatal(err)
	}
	if v.Envelope == nil || v.Envelope.Status != envelope.StatusCompleted || count(v.Trail, audit.EventStarted) != 1 {
		t.Errorf("alice's read under the id bob used: %+v, trail %v", v.Envelope, typesOf(v.Trail))
	}
	for _, ev := range v.Trail {
		if ev.Principal != "alice" {
			t.Errorf("alice's trail holds an event of %q: %s", ev.Principal, ev.Type)
		}
	}
}
