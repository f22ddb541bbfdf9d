//go:build unix

package chaos

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/demo"
	"github.com/capstan-dev/capstan/internal/testhooks"
)

// unclaimedRead is chaos.read: a read declared Idempotent, so it runs
// without a claim (design §14, "Reads without claims"). Each call is
// recorded on the demo's calls stream, as the demo's handlers are, then it
// sleeps ms milliseconds, honouring its context.
func unclaimedRead(js jetstream.JetStream) executor.Capability {
	return executor.Define("chaos.read", executor.Meta{Description: "Sleeps, as a read without claims.",
		Expose: executor.On(executor.SurfaceDirect), SideEffect: executor.SideEffectRead, Idempotent: true, Timeout: 10 * time.Second},
		func(ctx context.Context, c executor.Call[demo.SleepInput]) (demo.SleepOutput, error) {
			m := nats.NewMsg(demo.CallsSubject + "." + c.CapabilityID)
			m.Header.Set(demo.ExecutionIDHeader, c.ExecutionID)
			m.Header.Set(demo.PrincipalHeader, c.Principal)
			m.Header.Set(demo.AttemptHeader, strconv.Itoa(c.Attempt))
			if _, err := js.PublishMsg(ctx, m); err != nil {
				return demo.SleepOutput{}, err
			}
			select {
			case <-time.After(time.Duration(c.Input.Ms) * time.Millisecond):
				return demo.SleepOutput{SleptMs: c.Input.Ms}, nil
			case <-ctx.Done():
				return demo.SleepOutput{}, ctx.Err()
			}
		})
}

// Workers SIGKILLed while they run reads without claims: every read ends
// completed, in exactly one envelope, none OUTCOME_UNKNOWN, and no record
// is written; a read whose worker was killed mid-call ran again on another
// worker (two handler calls, and two capability.started on its trail unless
// the kill came within the 20 ms the first start is held).
func TestChaos_WorkersKilled_UnclaimedReadsRunAgain(t *testing.T) {
	t.Parallel()
	n := scale(200, 1000)
	d := scale(5*time.Second, 22*time.Second)
	r := newRig(t, chaosLease, 16)
	r.workerEnv = []string{envReads + "=unclaimed"}
	r.startServer()
	for range 3 {
		r.startWorker()
	}
	c := r.client("chaos.read")

	ids, k := killWhileSubmitting(t, r, c, n, d, func(i int) (string, any) {
		return "chaos.read", demo.SleepInput{Ms: 50 + spread(i, 300)}
	})

	tl := inspect(t, testhooks.Broker(c), ids)
	checkOneEnvelopeEach(t, tl, ids)
	// The kills are aimed at moments with reads in flight (calls stored
	// without their envelope); with no record, a read's re-run is what
	// shows a kill hit it.
	ranAgain, startedTwice := 0, 0
	for id, o := range tl.per {
		if o.env != nil && (o.env.Status != envelope.StatusCompleted || o.env.Attempts != 1) {
			t.Errorf("%s: %s after %d attempts (%+v), want completed after 1", id, o.env.Status, o.env.Attempts, o.env.Error)
		}
		if o.rec != nil {
			t.Errorf("%s: a read without claims has a record: %+v", id, o.rec)
		}
		if o.handlerCalls() > 1 {
			ranAgain++
			// A worker killed within 20 ms of a start takes the held
			// events with it: the re-run's start is on the trail.
			if o.started >= 2 {
				startedTwice++
			}
		}
		if o.started < 1 {
			t.Errorf("%s: no capability.started on its trail", id)
		}
	}
	if ranAgain == 0 || startedTwice == 0 {
		t.Errorf("%d kills, %d reads ran again, %d with both starts on the trail: %s", k, ranAgain, startedTwice, tl)
	}
	t.Logf("chaos.read: executions=%d kills=%d over %v; %s; ran again=%d (both starts on the trail: %d)",
		len(ids), k, d, tl, ranAgain, startedTwice)
}
