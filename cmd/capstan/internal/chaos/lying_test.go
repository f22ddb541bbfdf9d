//go:build unix

package chaos

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/internal/testhooks"

	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/demo"
	"github.com/nats-io/nats.go/jetstream"
)

// lyingEmailSend is email.send without its receipt, with a reconciler that
// answers "absent, proven" whatever the outbox holds: the reconciler a
// careless capability might declare. The chaos checks must see it.
func lyingEmailSend(js jetstream.JetStream) executor.Capability {
	return executor.Define("email.send", demo.EmailMeta, demo.SendEmailWithoutReceipt(js),
		executor.WithRecovery(executor.Recovery[demo.EmailInput, demo.EmailOutput]{
			ProvesAbsence: true,
			Reconcile: func(ctx context.Context, q executor.Reconciliation[demo.EmailInput]) (executor.Reconciled[demo.EmailOutput], error) {
				return executor.Reconciled[demo.EmailOutput]{Effect: executor.EffectAbsent}, nil
			},
		}))
}

// A reconciler that lies "absent" where the email was sent makes a second
// attempt run on top of the sent email: the chaos checks count every handler
// call against the outbox, and report it as a duplicate send, whatever the
// outbox made of it (it folds the second send into the first, as a provider
// keyed on the idempotency key would, so the outbox alone would not show it).
// This proves that TestChaos_WorkersKilled_EmailSentAtMostOnce would fail on
// such a reconciler.
func TestChaos_LyingReconciler_SeenAsDuplicateSends(t *testing.T) {
	t.Parallel()
	n := scale(120, 300)
	d := scale(4*time.Second, 8*time.Second)
	r := newRig(t, chaosLease, 16)
	r.workerEnv = []string{envEmail + "=lying"}
	r.startServer()
	for range 3 {
		r.startWorker()
	}
	c := r.client("email.send")

	ids, k := killWhileSubmitting(t, r, c, n, d, func(i int) (string, any) {
		// Long holds after the send: kills land after the effect.
		return "email.send", demo.EmailInput{To: fmt.Sprintf("user%d@example.com", i), Subject: "lie", HoldMs: 200 + spread(i, 300)}
	})

	tl := inspect(t, testhooks.Broker(c), ids)
	problems := emailProblems(tl)
	dup := 0
	for _, p := range problems {
		if strings.Contains(p, "after its email was sent") {
			dup++
		}
	}
	hits := checkKillsHit(t, r, tl)
	if dup == 0 {
		t.Fatalf("a reconciler lying \"absent\" went unseen: kills=%d (%d hit an attempt), %s; problems %v", k, hits, tl, problems)
	}
	// Every send it caused was folded into the first by the outbox: the
	// handler calls are what shows it.
	for id, o := range tl.per {
		if o.outbox > 1 {
			t.Errorf("%s: %d emails in the outbox", id, o.outbox)
		}
	}
	t.Logf("lying reconciler: executions=%d kills=%d (%d hit an attempt in flight); %s; duplicate sends seen=%d, e.g. %s",
		len(ids), k, hits, tl, dup, problems[0])
}
