package auth_test

import (
	"testing"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/broker"
)

// Workers stop their run of an execution on the cancel notice the worker that
// recorded the cancel publishes. A producer naming another principal's notice
// subject as the reply of a request it may make gets the answer in its own
// account: the notice never reaches the workers, bob's execution runs on
// until he cancels it himself.
func TestForge_CancelNoticeAimedAtAnotherPrincipalsExecutionStopsNothing(t *testing.T) {
	t.Parallel()
	r := newRig(t, false)
	ctx := testCtx(t)
	n := r.setup.Names()
	sc := r.newScene(t)
	get := request{name: "own envelope", subject: directGetOf(n.EnvelopesBucket(), broker.Key("alice", sc.aliceDone))}
	before := r.world(t)
	if landed := r.aim(t, sc, []request{get}, []string{n.CancelNoticeSubject("bob", sc.bobRun)}); len(landed) > 0 {
		t.Fatalf("the notice reached the workers: %v", landed)
	}
	r.assertWorldUnchanged(t, before)
	if st, err := sc.bob.Status(ctx, sc.bobRun); err != nil || st.Envelope != nil || st.Record == nil || st.Record.CancelRequested {
		t.Fatalf("bob's execution after alice's notice: %v %+v", err, st)
	}
	if _, err := sc.bob.Cancel(ctx, sc.bobRun); err != nil {
		t.Fatal(err)
	}
	if env, err := sc.bob.Await(ctx, sc.bobRun); err != nil || env.Status != envelope.StatusCancelled {
		t.Fatalf("%v %+v", err, env)
	}
}
