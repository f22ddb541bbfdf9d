package executor_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/execution"

	"github.com/nats-io/nats.go"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// The tests of this file prove the receipts and reconcilers of DESIGN §5: an
// attempt whose outcome was lost ends completed when it left a receipt or
// its reconciler finds the effect; a new attempt of work that is not retried
// runs only when the reconciler proved the effect absent; anything else
// ends OUTCOME_UNKNOWN as before. Each case puts the record a lost worker
// leaves, then lets a live worker take it over.

// mailOut is test.mail's output, and the receipt its handler records.
type mailOut struct {
	MessageID string `json:"messageId"`
}

// provider is where test.mail's effect lives: messages by idempotency key.
type provider struct {
	mu   sync.Mutex
	sent map[string]string
	// asked counts the reconciler's questions.
	asked int
}

func (p *provider) send(key string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sent == nil {
		p.sent = map[string]string{}
	}
	if id, ok := p.sent[key]; ok {
		return id
	}
	id := fmt.Sprintf("msg-%d", len(p.sent)+1)
	p.sent[key] = id
	return id
}

func (p *provider) lookup(key string) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.asked++
	id, ok := p.sent[key]
	return id, ok
}

func (p *provider) questions() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.asked
}

// mailCap is a non-idempotent external effect: the handler sends, records
// its receipt, and returns; recovery is what the case declares.
func mailCap(p *probe, pv *provider, r *executor.Recovery[map[string]any, mailOut]) executor.Capability {
	var opts []executor.Option[map[string]any, mailOut]
	if r != nil {
		opts = append(opts, executor.WithRecovery(*r))
	}
	return executor.Define("test.mail", executor.Meta{
		Description: "Sends a message; never retried.",
		Expose:      executor.On(executor.SurfaceDirect),
		SideEffect:  executor.SideEffectExternal,
		Timeout:     2 * time.Second,
	}, func(ctx context.Context, c executor.Call[map[string]any]) (mailOut, error) {
		p.called(ctx, c.Attempt)
		out := mailOut{MessageID: pv.send(c.IdempotencyKey)}
		if err := c.Receipt(ctx, out); err != nil {
			return mailOut{}, err
		}
		return out, ctx.Err()
	}, opts...)
}

// lookupMail is a reconciler asking the provider by idempotency key; absent
// answers EffectAbsent.
func lookupMail(pv *provider) func(context.Context, executor.Reconciliation[map[string]any]) (executor.Reconciled[mailOut], error) {
	return func(ctx context.Context, q executor.Reconciliation[map[string]any]) (executor.Reconciled[mailOut], error) {
		if id, ok := pv.lookup(q.IdempotencyKey); ok {
			return executor.Found(mailOut{MessageID: id}), nil
		}
		return executor.Reconciled[mailOut]{Effect: executor.EffectAbsent}, nil
	}
}

func TestRecovery_TakeoverTable(t *testing.T) {
	t.Parallel()
	const lease = 2 * time.Second
	running := func(id string, change func(r *execution.Record)) *execution.Record {
		r := &execution.Record{ExecutionID: id, CapabilityID: "test.mail", State: execution.StateRunning, Attempt: 1,
			Worker: deadWorker, LeaseUntil: pastLease(), StartedAt: pastLease()}
		if change != nil {
			change(r)
		}
		return r
	}
	receipt := func(v any) func(r *execution.Record) {
		return func(r *execution.Record) {
			r.Receipt, r.ReceiptAttempt, r.ReceiptAt = envelope.MustRaw(v), r.Attempt, pastLease()
		}
	}
	cancelled := func(id string) *execution.Record {
		return running(id, func(r *execution.Record) { r.CancelRequested, r.CancelRequestedAt = true, pastLease() })
	}
	cases := []struct {
		name string
		// recovery is the capability's, nil for none.
		recovery func(pv *provider) *executor.Recovery[map[string]any, mailOut]
		rec      func(id string) *execution.Record
		// sent is set when the lost attempt's effect happened.
		sent bool
		want takeover
		// output is the completed envelope's output; recovered how it was
		// recovered ("" for not at all).
		output    string
		recovered string
		// verdict is the capability.reconciled event's, "" for none.
		verdict, reason string
		// mayHaveRun: the envelope, cancelled, says the lost attempt may
		// have taken effect.
		mayHaveRun bool
	}{
		{
			name: "ReceiptRecorded_CompletedFromIt",
			rec:  func(id string) *execution.Record { return running(id, receipt(mailOut{MessageID: "msg-7"})) },
			sent: true,
			want: takeover{status: envelope.StatusCompleted, attempts: 1, takenFrom: execution.StateRunning},
			// The receipt is the output.
			output: "msg-7", recovered: envelope.RecoveredByReceipt,
		},
		{
			name: "ReceiptRecordedThenCancel_CompletedTheCancelCameAfter",
			rec: func(id string) *execution.Record {
				return running(id, func(r *execution.Record) {
					receipt(mailOut{MessageID: "msg-7"})(r)
					r.CancelRequested, r.CancelRequestedAt = true, pastLease()
				})
			},
			sent:   true,
			want:   takeover{status: envelope.StatusCompleted, attempts: 1, takenFrom: execution.StateRunning},
			output: "msg-7", recovered: envelope.RecoveredByReceipt,
		},
		{
			name: "ReceiptMadeOutputByFromReceipt",
			recovery: func(pv *provider) *executor.Recovery[map[string]any, mailOut] {
				return &executor.Recovery[map[string]any, mailOut]{
					FromReceipt: func(ctx context.Context, r executor.Receipt) (mailOut, error) {
						var id string
						if err := r.Decode(&id); err != nil {
							return mailOut{}, err
						}
						return mailOut{MessageID: "<" + id + ">"}, nil
					}}
			},
			rec:    func(id string) *execution.Record { return running(id, receipt("msg-9")) },
			sent:   true,
			want:   takeover{status: envelope.StatusCompleted, attempts: 1, takenFrom: execution.StateRunning},
			output: "<msg-9>", recovered: envelope.RecoveredByReceipt,
		},
		{
			// The receipt decides first: the reconciler, which could find
			// another id where the effect lives, is never asked.
			name: "ReceiptAndAReconciler_CompletedFromTheReceiptNeverAsked",
			recovery: func(pv *provider) *executor.Recovery[map[string]any, mailOut] {
				return &executor.Recovery[map[string]any, mailOut]{Reconcile: lookupMail(pv), ProvesAbsence: true}
			},
			rec:    func(id string) *execution.Record { return running(id, receipt(mailOut{MessageID: "msg-7"})) },
			sent:   true,
			want:   takeover{status: envelope.StatusCompleted, attempts: 1, takenFrom: execution.StateRunning},
			output: "msg-7", recovered: envelope.RecoveredByReceipt,
		},
		{
			name: "NoReceiptNoReconciler_OutcomeUnknown",
			rec:  func(id string) *execution.Record { return running(id, nil) },
			want: takeover{status: envelope.StatusFailed, code: envelope.CodeOutcomeUnknown, attempts: 1, takenFrom: execution.StateRunning},
		},
		{
			name: "ReconcilerFindsTheEffect_CompletedFromWhatItFound",
			recovery: func(pv *provider) *executor.Recovery[map[string]any, mailOut] {
				return &executor.Recovery[map[string]any, mailOut]{Reconcile: lookupMail(pv)}
			},
			rec:    func(id string) *execution.Record { return running(id, nil) },
			sent:   true,
			want:   takeover{status: envelope.StatusCompleted, attempts: 1, takenFrom: execution.StateRunning},
			output: "msg-1", recovered: envelope.RecoveredByReconciler, verdict: "found",
		},
		{
			name: "ReconcilerProvesAbsence_SecondAttemptUnderTheSameKey",
			recovery: func(pv *provider) *executor.Recovery[map[string]any, mailOut] {
				return &executor.Recovery[map[string]any, mailOut]{Reconcile: lookupMail(pv), ProvesAbsence: true}
			},
			rec:     func(id string) *execution.Record { return running(id, nil) },
			want:    takeover{status: envelope.StatusCompleted, attempts: 2, calls: []int{2}, takenFrom: execution.StateRunning, retried: 2},
			output:  "msg-1",
			verdict: "absent",
		},
		{
			name: "ReconcilerSaysAbsentWithoutProof_OutcomeUnknownNeverRunAgain",
			recovery: func(pv *provider) *executor.Recovery[map[string]any, mailOut] {
				return &executor.Recovery[map[string]any, mailOut]{Reconcile: lookupMail(pv)}
			},
			rec:     func(id string) *execution.Record { return running(id, nil) },
			want:    takeover{status: envelope.StatusFailed, code: envelope.CodeOutcomeUnknown, attempts: 1, takenFrom: execution.StateRunning},
			verdict: "absent",
		},
		{
			name: "ReconcilerFails_OutcomeUnknown",
			recovery: func(pv *provider) *executor.Recovery[map[string]any, mailOut] {
				return &executor.Recovery[map[string]any, mailOut]{ProvesAbsence: true,
					Reconcile: func(ctx context.Context, q executor.Reconciliation[map[string]any]) (executor.Reconciled[mailOut], error) {
						return executor.Reconciled[mailOut]{Effect: executor.EffectAbsent}, errors.New("provider unreachable (secret detail)")
					}}
			},
			rec:     func(id string) *execution.Record { return running(id, nil) },
			want:    takeover{status: envelope.StatusFailed, code: envelope.CodeOutcomeUnknown, attempts: 1, takenFrom: execution.StateRunning},
			verdict: "unknown", reason: "error",
		},
		{
			name: "ReconcilerPanics_OutcomeUnknown",
			recovery: func(pv *provider) *executor.Recovery[map[string]any, mailOut] {
				return &executor.Recovery[map[string]any, mailOut]{ProvesAbsence: true,
					Reconcile: func(ctx context.Context, q executor.Reconciliation[map[string]any]) (executor.Reconciled[mailOut], error) {
						panic("reconciler bug")
					}}
			},
			rec:     func(id string) *execution.Record { return running(id, nil) },
			want:    takeover{status: envelope.StatusFailed, code: envelope.CodeOutcomeUnknown, attempts: 1, takenFrom: execution.StateRunning},
			verdict: "unknown", reason: "panic",
		},
		{
			name: "ReconcilerOutOfTime_OutcomeUnknown",
			recovery: func(pv *provider) *executor.Recovery[map[string]any, mailOut] {
				return &executor.Recovery[map[string]any, mailOut]{ProvesAbsence: true, Timeout: 100 * time.Millisecond,
					Reconcile: func(ctx context.Context, q executor.Reconciliation[map[string]any]) (executor.Reconciled[mailOut], error) {
						<-ctx.Done()
						// Answering "absent" once cut off proves nothing.
						return executor.Reconciled[mailOut]{Effect: executor.EffectAbsent}, nil
					}}
			},
			rec:     func(id string) *execution.Record { return running(id, nil) },
			want:    takeover{status: envelope.StatusFailed, code: envelope.CodeOutcomeUnknown, attempts: 1, takenFrom: execution.StateRunning},
			verdict: "unknown", reason: "timeout",
		},
		{
			// A reconciler that ignores its context and answers "found" long
			// after its time: abandoned, its late answer not used.
			name: "ReconcilerHangsIgnoringItsContext_OutcomeUnknownLateAnswerUnused",
			recovery: func(pv *provider) *executor.Recovery[map[string]any, mailOut] {
				return &executor.Recovery[map[string]any, mailOut]{Timeout: 100 * time.Millisecond,
					Reconcile: func(ctx context.Context, q executor.Reconciliation[map[string]any]) (executor.Reconciled[mailOut], error) {
						time.Sleep(time.Second)
						return executor.Found(mailOut{MessageID: "late"}), nil
					}}
			},
			rec:     func(id string) *execution.Record { return running(id, nil) },
			sent:    true,
			want:    takeover{status: envelope.StatusFailed, code: envelope.CodeOutcomeUnknown, attempts: 1, takenFrom: execution.StateRunning},
			verdict: "unknown", reason: "timeout",
		},
		{
			name: "ReconciliationLostWithItsWorker_AskedAgain",
			recovery: func(pv *provider) *executor.Recovery[map[string]any, mailOut] {
				return &executor.Recovery[map[string]any, mailOut]{Reconcile: lookupMail(pv), ProvesAbsence: true}
			},
			rec: func(id string) *execution.Record {
				return running(id, func(r *execution.Record) { r.State, r.Reconciliations = execution.StateReconciling, 1 })
			},
			sent:   true,
			want:   takeover{status: envelope.StatusCompleted, attempts: 1, takenFrom: execution.StateReconciling},
			output: "msg-1", recovered: envelope.RecoveredByReconciler, verdict: "found",
		},
		{
			name: "ReconciliationsLostThreeTimes_OutcomeUnknownNotAskedAgain",
			recovery: func(pv *provider) *executor.Recovery[map[string]any, mailOut] {
				return &executor.Recovery[map[string]any, mailOut]{Reconcile: lookupMail(pv), ProvesAbsence: true}
			},
			rec: func(id string) *execution.Record {
				return running(id, func(r *execution.Record) { r.State, r.Reconciliations = execution.StateReconciling, 3 })
			},
			want: takeover{status: envelope.StatusFailed, code: envelope.CodeOutcomeUnknown, attempts: 1, takenFrom: execution.StateReconciling},
		},
		// A cancel stops nothing of a lost attempt: the reconciler is asked
		// first, and its answer decides with the cancel.
		{
			name: "CancelOfALostAttempt_ReconcilerFindsTheEffect_Completed",
			recovery: func(pv *provider) *executor.Recovery[map[string]any, mailOut] {
				return &executor.Recovery[map[string]any, mailOut]{Reconcile: lookupMail(pv)}
			},
			rec:    cancelled,
			sent:   true,
			want:   takeover{status: envelope.StatusCompleted, attempts: 1, takenFrom: execution.StateRunning},
			output: "msg-1", recovered: envelope.RecoveredByReconciler, verdict: "found",
		},
		{
			name: "CancelOfALostAttempt_ReconcilerProvesAbsence_CancelledNotRunAgain",
			recovery: func(pv *provider) *executor.Recovery[map[string]any, mailOut] {
				return &executor.Recovery[map[string]any, mailOut]{Reconcile: lookupMail(pv), ProvesAbsence: true}
			},
			rec:     cancelled,
			want:    takeover{status: envelope.StatusCancelled, code: envelope.CodeCancelled, attempts: 1, takenFrom: execution.StateRunning},
			verdict: "absent",
		},
		{
			name: "CancelOfALostAttempt_ReconcilerSaysAbsentWithoutProof_CancelledMayHaveRun",
			recovery: func(pv *provider) *executor.Recovery[map[string]any, mailOut] {
				return &executor.Recovery[map[string]any, mailOut]{Reconcile: lookupMail(pv)}
			},
			rec:        cancelled,
			want:       takeover{status: envelope.StatusCancelled, code: envelope.CodeCancelled, attempts: 1, takenFrom: execution.StateRunning},
			verdict:    "absent",
			mayHaveRun: true,
		},
		{
			name:       "CancelOfALostAttempt_NoReconciler_CancelledMayHaveRun",
			rec:        cancelled,
			sent:       true,
			want:       takeover{status: envelope.StatusCancelled, code: envelope.CodeCancelled, attempts: 1, takenFrom: execution.StateRunning},
			mayHaveRun: true,
		},
		{
			name: "AbsenceProvedNoReattemptLeft_FailedRetryable",
			recovery: func(pv *provider) *executor.Recovery[map[string]any, mailOut] {
				return &executor.Recovery[map[string]any, mailOut]{Reconcile: lookupMail(pv), ProvesAbsence: true, MaxReattempts: 1}
			},
			rec: func(id string) *execution.Record {
				return running(id, func(r *execution.Record) { r.Attempt, r.Reattempts = 2, 1 })
			},
			want:    takeover{status: envelope.StatusFailed, code: envelope.CodeExecutionFailed, attempts: 2, takenFrom: execution.StateRunning},
			verdict: "absent",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			env := testenv.Start(t)
			s := newStore(t, env)
			id := envelope.NewExecutionID()
			var pv provider
			if tc.sent {
				pv.send(envelope.IdempotencyKey(broker.Anonymous, id))
			}
			var r *executor.Recovery[map[string]any, mailOut]
			if tc.recovery != nil {
				r = tc.recovery(&pv)
			}
			lost := tc.rec(id)
			s.putRecord(lost)
			s.publish("test.mail", id)
			var p probe
			w := startWorker(t, env.Connect(t), executor.WorkerConfig{ID: "live-worker", Lease: lease}, mailCap(&p, &pv, r))

			got := s.await(id)
			tr := s.settled(id)
			checkTakeover(t, tc.want, got, tr, &p)
			checkRecovered(t, got, tr, tc.recovered, tc.output, w)
			ev, asked := find(tr, audit.EventReconciled)
			switch {
			case tc.verdict == "" && (asked || pv.questions() > 0):
				t.Errorf("reconciled %v (the provider asked %d times), want no reconciliation", ev.Data, pv.questions())
			case tc.verdict != "" && (!asked || field(ev, "verdict") != tc.verdict || field(ev, "attempt") != fmt.Sprint(lost.Attempt)):
				t.Errorf("reconciled %v (asked %v), want verdict %s about attempt %d; trail %v", ev.Data, asked, tc.verdict,
					lost.Attempt, typesOf(tr))
			case tc.reason != "" && field(ev, "reason") != tc.reason:
				t.Errorf("reconciled %v, want reason %s", ev.Data, tc.reason)
			}
			if tc.want.status == envelope.StatusCancelled {
				if said := strings.Contains(got.ForModel().Message, "may have taken effect"); said != tc.mayHaveRun {
					t.Errorf("cancelled, telling the model %q: says it may have taken effect %v, want %v", got.ForModel().Message,
						said, tc.mayHaveRun)
				}
			}
			if tc.want.retried > 0 {
				rt, _ := find(tr, audit.EventRetried)
				if field(rt, "reason") != "reconciled-absent" {
					t.Errorf("retried %v, want reason reconciled-absent", rt.Data)
				}
				if rec, _ := s.record(id); rec.Reattempts != 1 {
					t.Errorf("record counts %d re-attempts, want 1", rec.Reattempts)
				}
			}
			if tc.want.code == envelope.CodeExecutionFailed && (!got.Error.Retryable || !got.Error.ExposeToModel) {
				t.Errorf("absence proved: error %+v, want retryable and exposed", got.Error)
			}
			// SI-10: the trail never holds a receipt, what a reconciler found,
			// or a reconciler's error text.
			for _, ev := range tr {
				d := fmt.Sprint(ev.Data)
				for _, secret := range []string{"msg-", "secret detail", "reconciler bug"} {
					if strings.Contains(d, secret) {
						t.Errorf("%s carries %q: %v", ev.Type, secret, ev.Data)
					}
				}
			}
			if n := s.envelopeWrites(); n != 1 {
				t.Errorf("the envelope bucket stored %d writes, want 1", n)
			}
		})
	}
}

// checkRecovered checks the envelope's output and how it says it was
// recovered, the completed event's account of it, and what the model is told.
func checkRecovered(t *testing.T, got *envelope.Envelope, tr []audit.Event, how, output string, w *executor.Worker) {
	t.Helper()
	if output != "" {
		var out mailOut
		if err := got.Output.Decode(&out); err != nil || out.MessageID != output {
			t.Errorf("output %v (%v), want message %s", out, err, output)
		}
	}
	if how == "" {
		if got.Recovered != nil {
			t.Errorf("envelope says recovered %+v", got.Recovered)
		}
		return
	}
	if got.Recovered == nil || got.Recovered.How != how || got.Recovered.Attempt != got.Attempts {
		// What follows reads got.Recovered: stop here rather than panic on it.
		t.Fatalf("envelope recovered %+v, want %s of attempt %d", got.Recovered, how, got.Attempts)
	}
	if note := got.Recovered.ForModel(); !strings.Contains(note, "took effect") {
		t.Errorf("model told %q", note)
	}
	done, ok := find(tr, audit.EventCompleted)
	if !ok || field(done, "recovered") != how || field(done, "recoveredAttempt") != fmt.Sprint(got.Attempts) {
		t.Errorf("completed %v, want recovered %s", done.Data, how)
	}
	if how == envelope.RecoveredByReceipt {
		if h := field(done, "receiptHash"); len(h) != 64 {
			t.Errorf("completed %v: no receipt hash", done.Data)
		}
	}
	if n := w.Stats().Recovered; n != 1 {
		t.Errorf("worker counted %d recovered", n)
	}
}

// An attempt stopped by its timeout after it recorded its receipt completed:
// the receipt says its effect happened, and the envelope says so instead of
// TIMEOUT.
func TestReceipt_AttemptTimedOutAfterItsEffect_CompletedFromTheReceipt(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	s := newStore(t, env)
	var pv provider
	var p probe
	p.gate = func(ctx context.Context, _ int) {}
	slow := executor.Define("test.mail", executor.Meta{
		Description: "Sends, records its receipt, then hangs.",
		Expose:      executor.On(executor.SurfaceDirect), SideEffect: executor.SideEffectExternal, Timeout: 200 * time.Millisecond,
	}, func(ctx context.Context, c executor.Call[map[string]any]) (mailOut, error) {
		p.called(ctx, c.Attempt)
		out := mailOut{MessageID: pv.send(c.IdempotencyKey)}
		if err := c.Receipt(ctx, out); err != nil {
			return mailOut{}, err
		}
		<-ctx.Done()
		return mailOut{}, ctx.Err()
	})
	w := startWorker(t, env.Connect(t), executor.WorkerConfig{}, slow)
	id := envelope.NewExecutionID()
	s.publish("test.mail", id)
	got := s.await(id)
	tr := s.settled(id)
	if got.Status != envelope.StatusCompleted || got.Attempts != 1 {
		t.Fatalf("envelope %s after %d attempts, %+v; want completed", got.Status, got.Attempts, got.Error)
	}
	checkRecovered(t, got, tr, envelope.RecoveredByReceipt, "msg-1", w)
	rr, ok := find(tr, audit.EventReceiptRecorded)
	done, _ := find(tr, audit.EventCompleted)
	if !ok || field(rr, "attempt") != "1" || field(rr, "receiptHash") != field(done, "receiptHash") {
		t.Errorf("receipt_recorded %v, completed %v: want the same receipt's hash", rr.Data, done.Data)
	}
}

// A receipt comes too late once the attempt's outcome is decided: a handler
// that ignores its context and records after its timeout is refused, and the
// execution ends TIMEOUT as it was decided.
func TestReceipt_AfterTheAttemptEnded_Refused(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	s := newStore(t, env)
	refused := make(chan error, 1)
	late := executor.Define("test.mail", executor.Meta{
		Description: "Ignores its context, then records a receipt.",
		Expose:      executor.On(executor.SurfaceDirect), SideEffect: executor.SideEffectExternal, Timeout: 100 * time.Millisecond,
	}, func(ctx context.Context, c executor.Call[map[string]any]) (mailOut, error) {
		<-ctx.Done()
		time.Sleep(200 * time.Millisecond) // the engine has decided by now
		refused <- c.Receipt(context.Background(), mailOut{MessageID: "late"})
		return mailOut{}, nil
	})
	startWorker(t, env.Connect(t), executor.WorkerConfig{}, late)
	id := envelope.NewExecutionID()
	s.publish("test.mail", id)
	got := s.await(id)
	if got.Error == nil || got.Error.Code != envelope.CodeTimeout || got.Recovered != nil {
		t.Fatalf("envelope %s %+v recovered %+v, want TIMEOUT", got.Status, got.Error, got.Recovered)
	}
	select {
	case err := <-refused:
		if !errors.Is(err, executor.ErrReceiptRefused) {
			t.Fatalf("late receipt: %v, want ErrReceiptRefused", err)
		}
	case <-ctxT(t).Done():
		t.Fatal("the handler never tried its receipt")
	}
	if rec, _ := s.record(id); rec.Receipt != nil {
		t.Fatalf("record holds the late receipt %v", rec.Receipt)
	}
}

// A worker whose claim another worker took cannot record a receipt: the
// compare-and-swap under its claim fails, and the handler is told.
func TestReceipt_ClaimLost_Refused(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	s := newStore(t, env)
	started, proceed := make(chan struct{}), make(chan struct{})
	refused := make(chan error, 1)
	held := executor.Define("test.mail", executor.Meta{
		Description: "Waits, then records a receipt.",
		Expose:      executor.On(executor.SurfaceDirect), SideEffect: executor.SideEffectExternal, Timeout: time.Hour,
	}, func(ctx context.Context, c executor.Call[map[string]any]) (mailOut, error) {
		close(started)
		<-proceed
		refused <- c.Receipt(ctx, mailOut{MessageID: "msg-1"})
		return mailOut{}, ctx.Err()
	})
	// A lease far longer than the test: only the claim taken can end it.
	startWorker(t, env.Connect(t), executor.WorkerConfig{ID: "w", Lease: time.Minute}, held)
	id := envelope.NewExecutionID()
	s.publish("test.mail", id)
	waitClosed(t, started, "the handler never started")
	rec, rev := s.record(id)
	rec.Worker, rec.Claim, rec.LeaseUntil = "other-worker", "other-claim", time.Now().UTC().Add(time.Hour)
	rev = s.update(id, rec, rev)
	close(proceed)
	select {
	case err := <-refused:
		if !errors.Is(err, executor.ErrReceiptRefused) {
			t.Fatalf("receipt under a lost claim: %v, want ErrReceiptRefused", err)
		}
	case <-ctxT(t).Done():
		t.Fatal("the handler never tried its receipt")
	}
	if now, nowRev := s.record(id); nowRev != rev || now.Receipt != nil {
		t.Fatalf("record rewritten by the worker that lost its claim: revision %d, want %d; receipt %v", nowRev, rev, now.Receipt)
	}
}

// The caller's cancel, seen after the attempt recorded its receipt, does not
// un-happen the effect: the execution completed.
func TestReceipt_CancelledAfterTheEffect_Completed(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	s := newStore(t, env)
	recorded := make(chan struct{})
	held := executor.Define("test.mail", executor.Meta{
		Description: "Sends, records its receipt, then waits.",
		Expose:      executor.On(executor.SurfaceDirect), SideEffect: executor.SideEffectExternal, Timeout: time.Hour,
	}, func(ctx context.Context, c executor.Call[map[string]any]) (mailOut, error) {
		if err := c.Receipt(ctx, mailOut{MessageID: "msg-1"}); err != nil {
			return mailOut{}, err
		}
		close(recorded)
		<-ctx.Done()
		return mailOut{}, ctx.Err()
	})
	w := startWorker(t, env.Connect(t), executor.WorkerConfig{}, held)
	id := envelope.NewExecutionID()
	s.publish("test.mail", id)
	waitClosed(t, recorded, "the handler never recorded its receipt")
	if _, err := s.c.Cancel(ctxT(t), id); err != nil {
		t.Fatal(err)
	}
	got := s.await(id)
	tr := s.settled(id)
	if got.Status != envelope.StatusCompleted {
		t.Fatalf("envelope %s %+v, want completed", got.Status, got.Error)
	}
	checkRecovered(t, got, tr, envelope.RecoveredByReceipt, "msg-1", w)
}

// A handler that records no receipt pays nothing for receipts: its record is
// written once, as the claim of its attempt (DESIGN §14); one that records
// one pays one compare-and-swap.
func TestReceipt_CostsOneWriteOnlyToHandlersThatRecordOne(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	s := newStore(t, env)
	var pv provider
	var p probe
	startWorker(t, env.Connect(t), executor.WorkerConfig{}, mailCap(&p, &pv, nil), sendCap(&p))
	for _, tc := range []struct {
		capID  string
		writes uint64
	}{{"test.send", 1}, {"test.mail", 2}} {
		id := envelope.NewExecutionID()
		before := s.recordWrites()
		s.publish(tc.capID, id)
		s.await(id)
		if n := s.recordWrites() - before; n != tc.writes {
			t.Errorf("%s: its record was written %d times, want %d", tc.capID, n, tc.writes)
		}
	}
}

// recordWrites counts the writes the executions bucket ever stored.
func (s *store) recordWrites() uint64 {
	s.t.Helper()
	st, err := s.b.JS.Stream(ctxT(s.t), "KV_"+s.b.Names.ExecutionsBucket())
	if err != nil {
		s.t.Fatal(err)
	}
	return st.CachedInfo().State.LastSeq
}

// update writes rec over revision rev, as another worker would.
func (s *store) update(id string, rec *execution.Record, rev uint64) uint64 {
	s.t.Helper()
	rev, err := broker.Update(ctxT(s.t), s.b.Executions, broker.Key(broker.Anonymous, id), rec, rev)
	if err != nil {
		s.t.Fatal(err)
	}
	return rev
}

// A worker lost while it asks the reconciler is taken over like one lost
// during an attempt: the record says reconciling, and the next worker asks
// again, under its own claim.
func TestReconcile_WorkerLostMidReconciliation_TakenOverAndAskedAgain(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	s := newStore(t, env)
	var pv provider
	pv.send("") // the provider holds another execution's message
	id := envelope.NewExecutionID()
	pv.send(envelope.IdempotencyKey(broker.Anonymous, id))
	asking := make(chan struct{})
	var once sync.Once
	r := &executor.Recovery[map[string]any, mailOut]{ProvesAbsence: true, Timeout: time.Hour,
		Reconcile: func(ctx context.Context, q executor.Reconciliation[map[string]any]) (executor.Reconciled[mailOut], error) {
			first := false
			once.Do(func() { first = true })
			if first {
				// The first worker to ask is lost while it asks.
				close(asking)
				<-ctx.Done()
				return executor.Reconciled[mailOut]{}, ctx.Err()
			}
			return lookupMail(&pv)(ctx, q)
		}}
	var p probe
	s.putRecord(&execution.Record{ExecutionID: id, CapabilityID: "test.mail", State: execution.StateRunning, Attempt: 1,
		Worker: deadWorker, LeaseUntil: pastLease(), StartedAt: pastLease()})
	s.publish("test.mail", id)
	ncA := env.Connect(t)
	runWorkerUntilCut(t, ncA, executor.WorkerConfig{ID: "worker-a", Lease: time.Second}, mailCap(&p, &pv, r))
	waitClosed(t, asking, "the reconciler was never asked")
	if rec, _ := s.record(id); rec.State != execution.StateReconciling || rec.Worker != "worker-a" || rec.Reconciliations != 1 {
		t.Fatalf("record %+v while worker-a asks, want reconciling{1} held by worker-a", rec)
	}
	ncA.Close() // worker-a is cut off: its lease runs out unrenewed
	b := startWorker(t, env.Connect(t), executor.WorkerConfig{ID: "worker-b", Lease: time.Second}, mailCap(&p, &pv, r))

	got := s.await(id)
	tr := s.settled(id)
	if got.Status != envelope.StatusCompleted || got.FinalizedBy != "worker-b" || got.Recovered == nil ||
		got.Recovered.How != envelope.RecoveredByReconciler {
		t.Fatalf("envelope %s by %s, recovered %+v, error %+v", got.Status, got.FinalizedBy, got.Recovered, got.Error)
	}
	if n := p.calls.Load(); n != 0 {
		t.Fatalf("handler called %d times", n)
	}
	var states []string
	for _, ev := range tr {
		if ev.Type == audit.EventTakenOver {
			states = append(states, field(ev, "fromWorker")+":"+field(ev, "state"))
		}
	}
	if fmt.Sprint(states) != "["+deadWorker+":running worker-a:reconciling]" {
		t.Errorf("takeovers %v, want from %s (running) then from worker-a (reconciling)", states, deadWorker)
	}
	if n := count(tr, audit.EventReconciled); n != 1 {
		t.Errorf("%d capability.reconciled events, want worker-b's only", n)
	}
	if rec, _ := s.record(id); rec.Reconciliations != 2 {
		t.Errorf("record counts %d reconciliations, want 2", rec.Reconciliations)
	}
	if n := b.Stats().Recovered; n != 1 {
		t.Errorf("worker-b counted %d recovered", n)
	}
}

// runWorkerUntilCut runs a worker whose connection the test will close (a
// worker cut off, as a crash leaves it): its end is not checked.
func runWorkerUntilCut(t *testing.T, nc *nats.Conn, cfg executor.WorkerConfig, caps ...executor.Capability) {
	t.Helper()
	reg, err := executor.NewRegistry(caps...)
	if err != nil {
		t.Fatal(err)
	}
	w, err := executor.NewWorker(nc, reg, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = w.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	waitServing(t, nc, caps[0].ID())
}

// A receipt larger than MaxReceipt, which would ride every later write of
// the record, is refused and nothing is written; a small one after it is
// recorded. The execution ends as its handler returns.
func TestReceipt_TooLarge_RefusedNothingWritten(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	s := newStore(t, env)
	errs := make(chan error, 2)
	sizes := executor.Define("test.mail", executor.Meta{
		Description: "Records a receipt too large, then a small one.",
		Expose:      executor.On(executor.SurfaceDirect), SideEffect: executor.SideEffectExternal,
	}, func(ctx context.Context, c executor.Call[map[string]any]) (mailOut, error) {
		errs <- c.Receipt(ctx, strings.Repeat("x", executor.MaxReceipt))
		errs <- c.Receipt(ctx, mailOut{MessageID: "msg-1"})
		return mailOut{MessageID: "msg-1"}, nil
	})
	startWorker(t, env.Connect(t), executor.WorkerConfig{ID: "w"}, sizes)
	id := envelope.NewExecutionID()
	before := s.recordWrites()
	s.publish("test.mail", id)
	got := s.await(id)
	if n := s.recordWrites() - before; n != 2 {
		t.Errorf("the record was written %d times, want 2 (the claim, the small receipt)", n)
	}
	if err := <-errs; !errors.Is(err, executor.ErrReceiptRefused) || !strings.Contains(err.Error(), "more than") {
		t.Errorf("a receipt of %d bytes: %v, want ErrReceiptRefused for its size", executor.MaxReceipt+2, err)
	}
	if err := <-errs; err != nil {
		t.Errorf("a small receipt after it: %v", err)
	}
	if got.Status != envelope.StatusCompleted || got.Recovered != nil {
		t.Fatalf("envelope %s recovered %+v, want completed from its handler", got.Status, got.Recovered)
	}
	tr := s.settled(id)
	n := 0
	for _, ev := range tr {
		if ev.Type == audit.EventReceiptRecorded {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d receipts in the trail %v, want the small one", n, typesOf(tr))
	}
}

// A cancel that comes while the reconciler is asked about a lost attempt
// stops nothing of that attempt: the reconciler is not cut off, and its
// answer decides. Where it finds the effect, the execution completed; where
// it cannot tell, the execution ends cancelled saying the attempt may have
// taken effect.
func TestReconcile_CancelWhileAsked_TheAnswerDecides(t *testing.T) {
	t.Parallel()
	for _, found := range []bool{true, false} {
		t.Run(fmt.Sprintf("found=%v", found), func(t *testing.T) {
			t.Parallel()
			env := testenv.Start(t)
			s := newStore(t, env)
			var pv provider
			id := envelope.NewExecutionID()
			if found {
				pv.send(envelope.IdempotencyKey(broker.Anonymous, id))
			}
			asking, answer := make(chan struct{}), make(chan struct{})
			r := &executor.Recovery[map[string]any, mailOut]{Timeout: time.Hour,
				Reconcile: func(ctx context.Context, q executor.Reconciliation[map[string]any]) (executor.Reconciled[mailOut], error) {
					close(asking)
					select {
					case <-answer:
						return lookupMail(&pv)(ctx, q) // absent, without the proof, when not found
					case <-ctx.Done():
						return executor.Reconciled[mailOut]{}, ctx.Err()
					}
				}}
			var p probe
			s.putRecord(&execution.Record{ExecutionID: id, CapabilityID: "test.mail", State: execution.StateRunning, Attempt: 1,
				Worker: deadWorker, LeaseUntil: pastLease(), StartedAt: pastLease()})
			s.publish("test.mail", id)
			const lease = time.Second
			w := startWorker(t, env.Connect(t), executor.WorkerConfig{ID: "live-worker", Lease: lease}, mailCap(&p, &pv, r))
			waitClosed(t, asking, "the reconciler was never asked")
			if _, err := s.c.Cancel(ctxT(t), id); err != nil {
				t.Fatal(err)
			}
			if rec, _ := s.record(id); !rec.CancelRequested || rec.State != execution.StateReconciling {
				t.Fatalf("record %+v after the cancel, want reconciling with the cancel recorded", rec)
			}
			// A renewal of the lease reads the cancel in the record: the
			// execution holds it by then.
			time.Sleep(lease)
			close(answer)

			got := s.await(id)
			tr := s.settled(id)
			if found {
				checkTakeover(t, takeover{status: envelope.StatusCompleted, attempts: 1, takenFrom: execution.StateRunning}, got, tr, &p)
				checkRecovered(t, got, tr, envelope.RecoveredByReconciler, "msg-1", w)
				return
			}
			checkTakeover(t, takeover{status: envelope.StatusCancelled, code: envelope.CodeCancelled, attempts: 1,
				takenFrom: execution.StateRunning}, got, tr, &p)
			if m := got.ForModel().Message; !strings.Contains(m, "may have taken effect") {
				t.Errorf("cancelled, telling the model %q: the lost attempt may have taken effect", m)
			}
		})
	}
}

// A cancel does not cut off the reconciler asked about a lost attempt, but
// the worker's shutdown still does once a cancel came: the reconciler's
// context ends then, not when its time runs out, and the worker stops.
func TestReconcile_CancelWhileAsked_ShutdownStillEndsIt(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	s := newStore(t, env)
	var pv provider
	id := envelope.NewExecutionID()
	asking, cutOff := make(chan struct{}), make(chan struct{})
	r := &executor.Recovery[map[string]any, mailOut]{Timeout: time.Hour,
		Reconcile: func(ctx context.Context, q executor.Reconciliation[map[string]any]) (executor.Reconciled[mailOut], error) {
			close(asking)
			<-ctx.Done()
			close(cutOff)
			return executor.Reconciled[mailOut]{}, ctx.Err()
		}}
	var p probe
	s.putRecord(&execution.Record{ExecutionID: id, CapabilityID: "test.mail", State: execution.StateRunning, Attempt: 1,
		Worker: deadWorker, LeaseUntil: pastLease(), StartedAt: pastLease()})
	s.publish("test.mail", id)
	const lease = time.Second
	w := runWorkerOn(t, env.Connect(t), executor.WorkerConfig{ID: "live-worker", Lease: lease, Grace: lease}, mailCap(&p, &pv, r))
	waitClosed(t, asking, "the reconciler was never asked")
	if _, err := s.c.Cancel(ctxT(t), id); err != nil {
		t.Fatal(err)
	}
	// A renewal of the lease reads the cancel in the record: the execution
	// holds it by then.
	time.Sleep(lease)
	select {
	case <-cutOff:
		t.Fatal("the cancel cut the reconciler off")
	default:
	}
	w.Stop()
	waitClosed(t, cutOff, "the reconciler ran on after the worker's shutdown")
}
