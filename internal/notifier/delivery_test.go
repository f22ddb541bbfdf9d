package notifier

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/notify"
)

// An approval nobody decides is followed up at its expiry, once, though no
// process writes it expired.
func TestExpiry_UndecidedApprovalFollowedUpOnce(t *testing.T) {
	t.Parallel()
	r := newRig(t, brief(2*time.Second))
	hook := newReceiver(t, hookSecret)
	n, _ := r.run(t, hookConfig(hook.url, "*"))

	id := r.request(t, "ops.restart", struct{}{})
	hook.waitKey(t, Key(id, notify.EventRequested))
	d := hook.waitKey(t, Key(id, notify.EventExpired))
	r.idle(t, n, 0)
	if got := hook.keys(); !equalCounts(got, map[string]int{Key(id, notify.EventRequested): 1, Key(id, notify.EventExpired): 1}) {
		t.Fatalf("deliveries %v", got)
	}
	p := decodePayload(t, d.body)
	if p.Approval.Status != "expired" || p.Approval.Decision != nil || !p.OccurredAt.Equal(p.Approval.ExpiresAt) {
		t.Fatalf("expired payload %+v", p)
	}
}

// An approval decided before its expiry is not followed up as expired: the
// pending revision waiting for the expiry is gone with the decision.
func TestExpiry_DecidedApprovalNotExpired(t *testing.T) {
	t.Parallel()
	r := newRig(t, brief(3*time.Second))
	hook := newReceiver(t, hookSecret)
	n, _ := r.run(t, hookConfig(hook.url, "*"))

	decided := r.request(t, "ops.restart", struct{}{})
	hook.waitKey(t, Key(decided, notify.EventRequested))
	r.decide(t, decided, true, "")
	hook.waitKey(t, Key(decided, notify.EventApproved))
	// A second approval expiring after the first proves the first's expiry
	// passed while the notifier ran.
	later := r.request(t, "ops.restart", struct{}{})
	hook.waitKey(t, Key(later, notify.EventExpired))
	r.idle(t, n, 0)
	want := map[string]int{Key(decided, notify.EventRequested): 1, Key(decided, notify.EventApproved): 1, Key(later, notify.EventRequested): 1, Key(later, notify.EventExpired): 1}
	if got := hook.keys(); !equalCounts(got, want) {
		t.Fatalf("deliveries %v, want %v", got, want)
	}
}

// A channel's notifications begin when its consumer is created: an approval still
// pending then is notified, however old; one decided before is not.
func TestConsumerCreated_PendingNotifiedDecidedBeforeNot(t *testing.T) {
	t.Parallel()
	r := newRig(t, refund())
	pending := r.request(t, "orders.refund", RefundIn{OrderID: "o1", Amount: 900})
	decided := r.request(t, "orders.refund", RefundIn{OrderID: "o2", Amount: 900})
	r.decide(t, decided, false, "")

	hook := newReceiver(t, hookSecret)
	n, _ := r.run(t, hookConfig(hook.url, "finance"))
	hook.waitKey(t, Key(pending, notify.EventRequested))
	r.idle(t, n, 1)
	if got := hook.keys(); !equalCounts(got, map[string]int{Key(pending, notify.EventRequested): 1}) {
		t.Fatalf("deliveries %v", got)
	}
}

// Several notifiers share the consumer: each notification is sent by one of
// them, once.
func TestSeveralNotifiers_EachNotificationSentOnce(t *testing.T) {
	t.Parallel()
	const approvalsN = 40
	r := newRig(t, refund())
	hook := newReceiver(t, hookSecret)
	var ns []*Notifier
	for i := range 3 {
		cfg := hookConfig(hook.url, "finance")
		cfg.ID = fmt.Sprintf("notify-%d", i)
		n, _ := r.run(t, cfg)
		ns = append(ns, n)
	}
	ids := make([]string, approvalsN)
	var wg sync.WaitGroup
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ids[i] = r.request(t, "orders.refund", RefundIn{OrderID: fmt.Sprint("o", i), Amount: 501 + i})
		}()
	}
	wg.Wait()
	want := map[string]int{}
	for _, id := range ids {
		want[Key(id, notify.EventRequested)] = 1
		hook.waitKey(t, Key(id, notify.EventRequested))
	}
	r.idleAll(t, map[string]int{"hook": approvalsN}, ns...)
	if got := hook.keys(); !equalCounts(got, want) {
		t.Fatalf("%d deliveries of %d keys, want each of %d once", len(hook.deliveries()), len(got), approvalsN)
	}
	var sent uint64
	for _, n := range ns {
		sent += n.Stats().Channels[0].Sent
	}
	if sent != approvalsN {
		t.Fatalf("the notifiers count %d sent, want %d", sent, approvalsN)
	}
}

// A notifier stopped while a delivery waits for its retry hands it back,
// past its own last pull; the next notifier sends it, with the same
// idempotency key, and nothing is left delivered to the stopped one.
func TestStoppedMidRetry_NextNotifierSendsIt(t *testing.T) {
	t.Parallel()
	r := newRig(t, refund())
	hook := newReceiver(t, hookSecret)
	var down sync.Mutex
	failing := true
	hook.answer = func(int, delivery) int {
		down.Lock()
		defer down.Unlock()
		if failing {
			return 503
		}
		return 200
	}
	cfg := hookConfig(hook.url, "finance")
	cfg.Retry = Retry{Attempts: 100, Initial: time.Hour, Max: time.Hour}
	first, stop := r.run(t, cfg)
	id := r.request(t, "orders.refund", RefundIn{OrderID: "o1", Amount: 900})
	eventually(t, "a failed attempt", func() bool { return first.Stats().Channels[0].Retries == 1 })
	stop()

	down.Lock()
	failing = false
	down.Unlock()
	cfg.Retry = Retry{Attempts: 3, Initial: 10 * time.Millisecond}
	second, _ := r.run(t, cfg)
	eventually(t, "the second notifier's delivery", func() bool { return second.Stats().Channels[0].Sent == 1 })
	r.idleAll(t, map[string]int{"hook": 1}, first, second)
	ds := hook.deliveries()
	if len(ds) != 2 || ds[0].key != Key(id, notify.EventRequested) || ds[1].key != ds[0].key {
		t.Fatalf("deliveries %+v", ds)
	}
}

// Without the right to create consumers, a notifier whose consumer is missing
// says how to create it.
func TestMissingConsumer_SaysHowToCreateIt(t *testing.T) {
	t.Parallel()
	r := newRig(t, refund())
	cfg := hookConfig("https://hooks.example.com/x", "*")
	cfg.Logger = quiet()
	n, err := New(r.env.Connect(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	err = n.Run(ctx)
	if err == nil || !errors.Is(err, ErrNoConsumer) {
		t.Fatalf("Run: %v, want ErrNoConsumer", err)
	}
	if err := Provision(ctx, r.env.JetStream(t), Config{Channels: []Channel{{Name: "hook"}}}); err != nil {
		t.Fatal(err)
	}
	if err := Provision(ctx, r.env.JetStream(t), Config{Channels: []Channel{{Name: "hook"}}}); err != nil {
		t.Fatalf("a second Provision: %v", err)
	}
}
