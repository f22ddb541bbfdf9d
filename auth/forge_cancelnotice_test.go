package auth_test

import (
	"context"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/broker"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
)

// Workers stop their run of an execution on the cancel notice the worker that
// recorded the cancel publishes. The server also publishes there when a
// producer names the notice subject as the reply of a request it may make: a
// producer must not cancel another principal's execution so.
func TestForge_CancelNoticeAimedAtAnotherPrincipalsExecutionStopsNothing(t *testing.T) {
	t.Parallel()
	r := newRig(t, false)
	ctx := testCtx(t)
	n := r.setup.Names()
	bob, _, _ := r.client(t, "bob", executor.SurfaceDirect)
	alice, aliceNC, _ := r.client(t, "alice", executor.SurfaceDirect)
	mine, err := alice.Call(ctx, "t.echo", Echo{Text: "alice's"})
	if err != nil || mine.Status != envelope.StatusCompleted {
		t.Fatalf("%v %+v", err, mine)
	}
	id, err := bob.Submit(ctx, "t.send", Echo{Text: "hold"})
	if err != nil {
		t.Fatal(err)
	}
	r.trail(t, id, "capability.started")

	// The admin sees the notice the server sends, as the workers do.
	seen, err := r.admin.NC.SubscribeSync(n.CancelNoticeSubject("bob", id))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.admin.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	get := "$JS.API.DIRECT.GET.KV_" + n.EnvelopesBucket() + ".$KV." + n.EnvelopesBucket() + "." + broker.Key("alice", mine.ExecutionID)
	if err := aliceNC.PublishRequest(get, n.CancelNoticeSubject("bob", id), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := seen.NextMsgWithContext(ctx); err != nil {
		t.Fatal(err)
	}
	// The workers had the notice as the admin did; bob's execution runs on.
	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	if env, err := bob.Await(short, id); err == nil {
		t.Fatalf("alice's notice ended bob's execution: %s %+v", env.Status, env.Error)
	}
	if _, err := bob.Cancel(ctx, id); err != nil {
		t.Fatal(err)
	}
	if env, err := bob.Await(ctx, id); err != nil || env.Status != envelope.StatusCancelled {
		t.Fatalf("%v %+v", err, env)
	}
}
