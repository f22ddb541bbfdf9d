package auth_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
)

// A producer reads its own records and envelopes only: not even the keys of
// another principal's, which name its executions. The stream information a
// producer may ask of the envelope and record buckets must not list them.
func TestForge_StreamInfoDoesNotListAnotherPrincipalsExecutions(t *testing.T) {
	t.Parallel()
	r := newRig(t, false)
	ctx := testCtx(t)
	n := r.setup.Names()
	bob, _, _ := r.client(t, "bob", executor.SurfaceDirect)
	_, aliceNC, _ := r.client(t, "alice", executor.SurfaceDirect)
	bobs, err := bob.Call(ctx, "t.echo", Echo{Text: "bob's"})
	if err != nil || bobs.Status != envelope.StatusCompleted {
		t.Fatalf("%v %+v", err, bobs)
	}
	for _, bucket := range []string{n.EnvelopesBucket(), n.ExecutionsBucket()} {
		req, _ := json.Marshal(map[string]any{"subjects_filter": "$KV." + bucket + ".>"})
		// A refused request is answered only by its timeout: a short one for
		// each bucket, so that the first refusal does not use up the test's
		// context and leave the second bucket unasked.
		short, cancel := context.WithTimeout(ctx, 2*time.Second)
		m, err := aliceNC.RequestWithContext(short, "$JS.API.STREAM.INFO.KV_"+bucket, req)
		cancel()
		if err != nil {
			continue // refused: nothing listed
		}
		if strings.Contains(string(m.Data), broker.Key("bob", bobs.ExecutionID)) {
			t.Errorf("alice's stream info of %s lists bob's execution %s", bucket, bobs.ExecutionID)
		}
	}
}
