package notifier

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/auth"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/approvalstore"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/capstan-dev/capstan/notify"
)

// A notifier's credentials read the notify consumers and nothing else: with
// them, an attacker can neither write a bucket or a stream (directly, through
// a consumer it creates, or through another notifier's status answer), nor
// decide, submit, read an approval by key, remove the consumer or listen to
// envelopes. Afterwards everything is as it was; and with the same
// credentials a notifier delivers.
func TestNotifierCredentials_ReadTheConsumerOnly(t *testing.T) {
	t.Parallel()
	setup, err := auth.Init(filepath.Join(t.TempDir(), "secrets"), "")
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range []auth.Grant{
		{Principal: "alice", Role: auth.RoleProducer, Actors: []string{"user:alice"}, Capabilities: []string{"orders.*"}},
		{Principal: "notifier", Role: auth.RoleNotifier},
	} {
		if err := setup.Add(g); err != nil {
			t.Fatal(err)
		}
	}
	env := testenv.Start(t, testenv.Auth(setup))
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	admin := env.Connect(t)
	b, err := broker.Provision(ctx, admin, broker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := auth.PublishGrants(ctx, b.JS, setup, 0); err != nil {
		t.Fatal(err)
	}
	startWorker(t, env.ConnectAs(t, auth.WorkerPrincipal), refund())
	if err := Provision(ctx, b.JS, Config{Channels: []Channel{{Name: "hook"}}}); err != nil {
		t.Fatal(err)
	}
	client, err := executor.NewClient(env.ConnectAs(t, "alice"), executor.ClientConfig{Actor: alice})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	call, err := client.Call(ctx, "orders.refund", RefundIn{OrderID: "o1", Amount: 900})
	if err != nil || call.Status != envelope.StatusApprovalRequired {
		t.Fatalf("call: %v %+v", err, call)
	}
	id := call.Approval.ID

	// A notifier answering status requests: the attacker will try to make
	// it write where the attacker may not.
	hook := newReceiver(t, hookSecret)
	cfg := hookConfig(hook.url, "finance")
	cfg.Logger = quiet()
	n, err := New(env.ConnectAs(t, "notifier"), cfg)
	if err != nil {
		t.Fatal(err)
	}
	runNotifier(t, &rig{env: env, names: b.Names}, n)
	hook.waitKey(t, Key(id, notify.EventRequested))

	var mu sync.Mutex
	var violations []string
	nc := env.ConnectAs(t, "notifier", nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		mu.Lock()
		violations = append(violations, err.Error())
		mu.Unlock()
	}))
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	execBefore, err := b.Exec.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	approvalsStream, err := b.JS.Stream(ctx, "KV_"+b.Names.ApprovalsBucket())
	if err != nil {
		t.Fatal(err)
	}
	// The consumers there before the attacks: the notifier's, and the
	// workers' own watcher of the bucket.
	consumersBefore := consumerNames(ctx, approvalsStream)
	if !slices.Contains(consumersBefore, b.Names.NotifyConsumer("hook")) {
		t.Fatalf("consumers of the approvals stream before the attacks: %v", consumersBefore)
	}
	forged, _ := envelope.Marshal(&approvals.Record{ID: id, Status: approvals.StatusApproved, Decision: &approvals.Decision{Status: approvals.StatusApproved, Approver: carol}})
	n1 := b.Names
	short := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, 2*time.Second) }

	// Writes, straight.
	_ = nc.Publish("$KV."+n1.ApprovalsBucket()+"."+id, forged)
	_ = nc.Publish("$KV."+n1.EnvelopesBucket()+".alice.forged", forged)
	_ = nc.Publish(n1.ExecSubject("notifier", "orders.refund"), []byte("{}"))
	_ = nc.Publish(n1.ExecSubject("alice", "orders.refund"), []byte("{}"))
	// A decision, and a read of the approval by key.
	if _, err := nc.Request(n1.DecideSubject("notifier"), forged, time.Second); err == nil {
		t.Error("a decision was answered")
	}
	if _, err := nc.Request("$JS.API.DIRECT.GET.KV_"+n1.ApprovalsBucket()+".$KV."+n1.ApprovalsBucket()+"."+id, nil, time.Second); err == nil {
		t.Error("a direct get of the approval was answered")
	}
	// A push consumer delivering approvals into the envelopes bucket.
	c1, cancel1 := short()
	_, err = js.CreateConsumer(c1, "KV_"+n1.ApprovalsBucket(), jetstream.ConsumerConfig{Durable: "evil", AckPolicy: jetstream.AckNonePolicy})
	cancel1()
	if err == nil {
		t.Error("the notifier created a consumer")
	}
	if _, err := nc.Request("$JS.API.CONSUMER.CREATE.KV_"+n1.ApprovalsBucket()+".push",
		[]byte(`{"stream_name":"KV_`+n1.ApprovalsBucket()+`","config":{"name":"push","deliver_subject":"$KV.`+n1.EnvelopesBucket()+`.alice.push","ack_policy":"none"}}`), time.Second); err == nil {
		t.Error("a push consumer's create was answered")
	}
	// Removing the consumer every notifier shares.
	c2, cancel2 := short()
	err = js.DeleteConsumer(c2, "KV_"+n1.ApprovalsBucket(), n1.NotifyConsumer("hook"))
	cancel2()
	if err == nil {
		t.Error("the notifier deleted the notify consumer")
	}
	// Another notifier as a deputy: a status request answered into a bucket.
	_ = nc.PublishRequest(n1.NotifyStatusSubject(), "$KV."+n1.EnvelopesBucket()+".alice.deputy", nil)
	// Listening to envelopes, or everything.
	if _, err := nc.SubscribeSync(n1.EnvelopeSubjects()); err != nil {
		t.Fatal(err)
	}
	if _, err := nc.SubscribeSync(">"); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := admin.Flush(); err != nil {
		t.Fatal(err)
	}

	// Nothing changed.
	store := approvalstore.NewStore(b.Approvals, nil)
	if rec, err := store.Get(ctx, id); err != nil || rec.Status != approvals.StatusPending || rec.Decision != nil {
		t.Errorf("the approval after the attacks: %+v, %v", rec, err)
	}
	for _, k := range []string{"alice.forged", "alice.push", "alice.deputy"} {
		if _, err := b.Envelopes.Get(ctx, k); !errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Errorf("envelope %s: %v, want none", k, err)
		}
	}
	if info, err := b.Exec.Info(ctx); err != nil || info.State.Msgs != execBefore.State.Msgs || info.State.LastSeq != execBefore.State.LastSeq {
		t.Errorf("the exec stream changed: %+v, before %+v", info.State, execBefore.State)
	}
	if consumers := consumerNames(ctx, approvalsStream); !slices.Equal(consumers, consumersBefore) {
		t.Errorf("consumers of the approvals stream: %v, before the attacks %v", consumers, consumersBefore)
	}
	// The client hands the server's errors to the handler on a goroutine of
	// its own, so a violation may be reported after the flush has returned.
	reported := func() string {
		mu.Lock()
		defer mu.Unlock()
		return strings.Join(violations, "\n")
	}
	for _, want := range []string{`Subscription to "` + n1.EnvelopeSubjects() + `"`, `Subscription to ">"`,
		`Publish to "$KV.` + n1.ApprovalsBucket()} {
		deadline := time.Now().Add(guard)
		for !strings.Contains(reported(), want) {
			if time.Now().After(deadline) {
				t.Fatalf("no permissions violation for %s; violations:\n%s", want, reported())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	// The same credentials deliver: the decision reaches the receiver.
	if _, err := store.Decide(ctx, id, approvals.Verdict{Approve: true, Approver: carol}); err != nil {
		t.Fatal(err)
	}
	hook.waitKey(t, Key(id, notify.EventApproved))
	var p notify.Payload
	_ = json.Unmarshal(hook.waitKey(t, Key(id, notify.EventApproved)).body, &p)
	if p.Approval.Status != approvals.StatusApproved {
		t.Fatalf("payload %+v", p)
	}
}

// consumerNames are the names of a stream's consumers, sorted.
func consumerNames(ctx context.Context, s jetstream.Stream) []string {
	var names []string
	for c := range s.ConsumerNames(ctx).Name() {
		names = append(names, c)
	}
	slices.Sort(names)
	return names
}
