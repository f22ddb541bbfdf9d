package oplog

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// Confirm lists every worker that answers within a worker's bound, the one
// slow to apply the change too: a worker that answers at once does not cut
// the others short.
func TestConfirm_WaitsForTheWorkersSlowToAnswer(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	n := broker.NewNames("")
	answer := func(worker string, after time.Duration, applied bool) {
		nc := env.Connect(t)
		sub, err := nc.Subscribe(n.AppliedSubject(), func(m *nats.Msg) {
			go func() {
				time.Sleep(after)
				b, err := envelope.Marshal(&AppliedReply{V: envelope.Version, Worker: worker, Applied: applied})
				if err == nil {
					_ = m.Respond(b)
				}
			}()
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sub.Unsubscribe() })
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	answer("quick", 0, true)
	answer("slow", AnswerWithin/2, true)
	answer("behind", AnswerWithin*3/4, false) // its copy has not caught up
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	got, err := Confirm(ctx, env.Connect(t), n, Pauses, 1, "", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"behind": false, "quick": true, "slow": true}
	if len(got) != len(want) {
		t.Fatalf("%d answers %+v, want the three workers'", len(got), got)
	}
	for _, r := range got {
		if a, ok := want[r.Worker]; !ok || a != r.Applied {
			t.Errorf("answer %+v, want %v", r, want)
		}
	}
}
