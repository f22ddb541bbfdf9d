package executor_test

import (
	"testing"
	"time"

	"github.com/capstan-dev/capstan/broker"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/testenv"
)

// NOT_STARTED tells the model that the operation never ran (DESIGN §13). A
// request whose non-idempotent attempt started, whose worker was lost, and
// whose pool stayed down longer than the record window has no record left
// when it is seen again past its start deadline: the missing record does not
// prove that it never started, so it must end OUTCOME_UNKNOWN, as the
// redelivery of such a request before its start deadline does
// (TestRecordWindow_RedeliveryAfterTheRecordExpired_OutcomeUnknownNoSecondAttempt).
func TestStartDeadline_StartedAttemptWhoseRecordWent_NeverNotStarted(t *testing.T) {
	for _, by := range []string{"delivery", "sweeper"} {
		t.Run(by, func(t *testing.T) {
			cfg := broker.Config{RecordWindow: 2 * time.Second}
			env := testenv.Start(t)
			s := newStoreWith(t, env, cfg, executor.ClientConfig{})
			var p probe
			started, _ := holdUntilDone(&p)
			lostConn := env.Connect(t)
			s.runWorker(lostConn, executor.WorkerConfig{Pool: "p", Lease: time.Second, Broker: cfg, SweepInterval: -1}, sendCap(&p))
			// The start window is the record window: once the record has gone,
			// the start deadline has passed too.
			id, err := s.c.Submit(ctxT(t), "test.send", map[string]any{"n": 1}, executor.StartWithin(cfg.RecordWindow))
			if err != nil {
				t.Fatal(err)
			}
			waitClosed(t, started, "the handler never started")
			lostConn.Close() // the worker is lost mid-attempt; its pool is down
			s.waitRecordGone(id)

			if by == "delivery" {
				// The pool comes back and receives the request again.
				s.runWorker(env.Connect(t), executor.WorkerConfig{Pool: "p", Lease: time.Second, Broker: cfg, SweepInterval: -1}, sendCap(&p))
			} else {
				// The pool stays down; a worker of another pool sweeps.
				s.runWorker(env.Connect(t), executor.WorkerConfig{Pool: "other", Broker: cfg, SweepInterval: 50 * time.Millisecond}, echoCap(nil))
			}
			got := s.await(id)
			if n := p.calls.Load(); n != 1 {
				t.Fatalf("handler called %d times, want the lost attempt only", n)
			}
			if got.Status != envelope.StatusFailed || got.Error == nil || got.Error.Code != envelope.CodeOutcomeUnknown {
				t.Fatalf("envelope %s after %d attempts, error %+v: the attempt ran, want OUTCOME_UNKNOWN", got.Status, got.Attempts, got.Error)
			}
		})
	}
}
