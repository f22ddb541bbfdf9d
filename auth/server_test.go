package auth_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/capstan-dev/capstan/auth"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/grantwatch"
	"github.com/capstan-dev/capstan/internal/testenv"
)

func TestMain(m *testing.M) {
	testenv.RaiseParallel()
	code := m.Run()
	if officialBinary.dir != "" {
		_ = os.RemoveAll(officialBinary.dir)
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: errors on successful test run: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// violations collects the permission errors the server reports to a connection.
type violations struct {
	mu   sync.Mutex
	errs []string
	seen chan struct{}
}

func newViolations() *violations { return &violations{seen: make(chan struct{}, 64)} }

func (v *violations) handler() nats.Option {
	return nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if errors.Is(err, nats.ErrPermissionViolation) || strings.Contains(err.Error(), "Permissions Violation") {
			v.mu.Lock()
			v.errs = append(v.errs, err.Error())
			v.mu.Unlock()
			v.seen <- struct{}{}
		}
	})
}

// wait returns the server's permission error that names subject, failing the
// test if none comes before ctx ends.
func (v *violations) wait(t *testing.T, ctx context.Context, subject string) {
	t.Helper()
	for {
		v.mu.Lock()
		for _, e := range v.errs {
			if strings.Contains(e, subject) {
				v.mu.Unlock()
				return
			}
		}
		v.mu.Unlock()
		select {
		case <-v.seen:
		case <-ctx.Done():
			t.Fatalf("no permissions violation for %s; seen %v", subject, v.errs)
		}
	}
}

// secured starts a server with a fresh setup holding producers alice and bob,
// provisions capstan's resources and publishes the grants as the admin.
func secured(t *testing.T) (*testenv.Env, *auth.Setup, *broker.Broker) {
	t.Helper()
	setup, err := auth.Init(t.TempDir(), "")
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range []auth.Grant{
		{Principal: "alice", Role: auth.RoleProducer, Actors: []string{"user:alice"}, Capabilities: []string{"demo.*"}},
		{Principal: "bob", Role: auth.RoleProducer, Actors: []string{"user:bob"}, Capabilities: []string{"*"}},
		{Principal: "carol", Role: auth.RoleApprover, Actors: []string{"user:carol"}, Types: []string{"finance"}},
	} {
		if err := setup.Add(g); err != nil {
			t.Fatal(err)
		}
	}
	env := testenv.Start(t, testenv.Auth(setup))
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	b, err := broker.Provision(ctx, env.Connect(t), broker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := auth.PublishGrants(ctx, b.JS, setup, 1); err != nil {
		t.Fatal(err)
	}
	return env, setup, b
}

func TestPermissions_AnonymousClientIsRefused(t *testing.T) {
	t.Parallel()
	env, _, _ := secured(t)
	nc, err := nats.Connect(env.URL, nats.MaxReconnects(0))
	if err == nil {
		nc.Close()
		t.Fatal("a client without credentials connected")
	}
}

func TestPermissions_ProducerPublishesOnlyUnderItsOwnToken(t *testing.T) {
	t.Parallel()
	env, setup, b := secured(t)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	v := newViolations()
	alice := env.ConnectAs(t, "alice", v.handler())
	js, err := jetstream.New(alice)
	if err != nil {
		t.Fatal(err)
	}
	n := broker.NewNames(setup.Prefix)
	if _, err := js.Publish(ctx, n.ExecSubject("alice", "demo.echo"), []byte("x")); err != nil {
		t.Fatalf("alice's own request refused: %v", err)
	}
	for _, subject := range []string{
		n.ExecSubject("bob", "demo.echo"),       // another principal's token
		n.ExecSubject("alice", "orders.refund"), // beyond its capability grants
		n.ExecSubject(broker.Anonymous, "demo.echo"),
		n.CancelSubject("bob", "0198"),
		n.DecideSubject("alice"),
		n.AuditSubject("0198"),
		"$KV." + n.EnvelopesBucket() + ".alice.0198",
		"$KV." + n.ApprovalsBucket() + ".a1",
		"$KV." + n.ExecutionsBucket() + ".alice.0198",
		"$KV." + n.CatalogBucket() + ".demo.echo",
		"$KV." + n.GrantsBucket() + ".alice",
		"$JS.API.STREAM.PURGE." + n.AuditStream(),
		"$JS.API.STREAM.DELETE." + n.AuditStream(),
		"$JS.API.STREAM.CREATE.X",
		// No consumer of any kind: a push consumer delivers wherever its
		// creator says, another principal's cancel subject included.
		"$JS.API.CONSUMER.CREATE.KV_" + n.CatalogBucket(),
		"$JS.API.CONSUMER.CREATE.KV_" + n.CatalogBucket() + ".c.>",
		"$JS.API.CONSUMER.CREATE." + n.AuditStream(),
		"$JS.API.CONSUMER.DURABLE.CREATE." + n.ExecStream() + ".d",
	} {
		if err := alice.Publish(subject, []byte("forged")); err != nil {
			t.Fatal(err)
		}
		v.wait(t, ctx, subject)
	}
	queue, err := b.JS.Stream(ctx, n.QueueStream("alice"))
	if err != nil {
		t.Fatal(err)
	}
	if info := queue.CachedInfo(); info.State.Msgs != 1 {
		t.Fatalf("alice's queue holds %d requests, want her one", info.State.Msgs)
	}
}

func TestPermissions_ProducerReceivesOnlyItsOwnEnvelopes(t *testing.T) {
	t.Parallel()
	env, setup, b := secured(t)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	n := broker.NewNames(setup.Prefix)
	v := newViolations()
	alice := env.ConnectAs(t, "alice", v.handler())
	if _, err := alice.SubscribeSync(n.EnvelopeSubjects()); err != nil {
		t.Fatal(err)
	}
	v.wait(t, ctx, n.EnvelopeSubjects())
	own, err := alice.SubscribeSync(n.EnvelopeSubjectsOf("alice"))
	if err != nil {
		t.Fatal(err)
	}
	if err := alice.Flush(); err != nil {
		t.Fatal(err)
	}
	// A worker's envelope for each principal: alice's arrives, bob's does not.
	for _, p := range []string{"bob", "alice"} {
		if _, err := b.Envelopes.Create(ctx, broker.Key(p, "0198"), []byte(p)); err != nil {
			t.Fatal(err)
		}
	}
	m, err := own.NextMsg(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if string(m.Data) != "alice" {
		t.Fatalf("alice received %q", m.Data)
	}
	// As a client reads: by key, without the bucket's stream information,
	// which a producer may not ask for.
	ab, err := broker.Open(ctx, alice, broker.Config{Prefix: setup.Prefix})
	if err != nil {
		t.Fatalf("alice cannot open the buckets: %v", err)
	}
	kv := ab.Envelopes
	if e, err := kv.Get(ctx, broker.Key("alice", "0198")); err != nil || string(e.Value()) != "alice" {
		t.Fatalf("alice reads her own envelope: %v", err)
	}
	short, cancelShort := context.WithTimeout(ctx, time.Second)
	defer cancelShort()
	if _, err := kv.Get(short, broker.Key("bob", "0198")); err == nil {
		t.Fatal("alice read bob's envelope")
	}
	v.wait(t, ctx, "$KV."+n.EnvelopesBucket()+".bob.0198")
}

func TestPermissions_AuditStreamRefusesDeleteAndPurge(t *testing.T) {
	t.Parallel()
	env, setup, b := secured(t)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if _, err := b.JS.Publish(ctx, broker.NewNames(setup.Prefix).AuditSubject("0198"), []byte("e")); err != nil {
		t.Fatal(err)
	}
	// Even the admin, who may call the API, cannot remove an event.
	if err := b.Audit.Purge(ctx); err == nil {
		t.Fatal("audit stream purged")
	}
	if err := b.Audit.DeleteMsg(ctx, 1); err == nil {
		t.Fatal("audit event deleted")
	}
	// A worker may not delete the stream either.
	wjs, err := jetstream.New(env.ConnectAs(t, auth.WorkerPrincipal))
	if err != nil {
		t.Fatal(err)
	}
	short, cancelShort := context.WithTimeout(ctx, 2*time.Second)
	defer cancelShort()
	if err := wjs.DeleteStream(short, broker.NewNames(setup.Prefix).AuditStream()); err == nil {
		t.Fatal("a worker deleted the audit stream")
	}
	info, err := b.Audit.Info(ctx)
	if err != nil || info.State.Msgs != 1 {
		t.Fatalf("audit stream: %v, %+v", err, info)
	}
}

// A worker that starts before the grants exist runs open until an admin
// publishes them; from then on it knows every principal and refuses the
// anonymous one.
func TestGrants_PublishedAfterTheWorkerStartedAreFound(t *testing.T) {
	t.Parallel()
	setup, err := auth.Init(t.TempDir(), "")
	if err != nil {
		t.Fatal(err)
	}
	if err := setup.Add(auth.Grant{Principal: "alice", Role: auth.RoleProducer, Actors: []string{"user:alice"}, Capabilities: []string{"*"}}); err != nil {
		t.Fatal(err)
	}
	env := testenv.Start(t, testenv.Auth(setup))
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	wjs, err := jetstream.New(env.ConnectAs(t, auth.WorkerPrincipal))
	if err != nil {
		t.Fatal(err)
	}
	grants, err := grantwatch.Watch(ctx, wjs, broker.NewNames(setup.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	defer grants.Stop()
	if !grants.Open() {
		t.Fatal("no grants bucket yet, but not open")
	}
	ajs, err := jetstream.New(env.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := auth.PublishGrants(ctx, ajs, setup, 1); err != nil {
		t.Fatal(err)
	}
	alice := envelope.Actor{Kind: "user", ID: "alice"}
	for grants.CheckRequest("alice", alice, "direct", "demo.echo") != nil {
		select {
		case <-ctx.Done():
			t.Fatal("the published grants were never found")
		case <-time.After(100 * time.Millisecond):
		}
	}
	if grants.Open() || grants.CheckRequest(broker.Anonymous, alice, "direct", "demo.echo") == nil {
		t.Fatal("still open after the grants were published")
	}
}

// A removed principal is disconnected at once by a push, with no restart,
// and its credentials connect no more; its grant leaves the bucket.
func TestRemove_DisconnectsAtOnceAndRevokesTheGrant(t *testing.T) {
	t.Parallel()
	env, setup, b := secured(t)
	kept, err := os.ReadFile(setup.CredsPath("alice"))
	if err != nil {
		t.Fatal(err)
	}
	copyPath := filepath.Join(t.TempDir(), "alice.creds")
	if err := os.WriteFile(copyPath, kept, 0o600); err != nil {
		t.Fatal(err)
	}
	closed := make(chan struct{})
	alice := env.ConnectAs(t, "alice", nats.NoReconnect(), nats.ClosedHandler(func(*nats.Conn) { close(closed) }))
	if err := alice.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := setup.Remove("alice"); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{setup.CredsPath("alice"), filepath.Join(setup.Dir, "alice.account.nk")} {
		if _, err := os.Stat(f); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s: %v", f, err)
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	env.PushAccounts(t)
	select {
	case <-closed:
	case <-ctx.Done():
		t.Fatal("alice's connection outlived the push of her removal")
	}
	if err := auth.PublishGrants(ctx, b.JS, setup, 1); err != nil {
		t.Fatal(err)
	}
	kv, err := b.JS.KeyValue(ctx, broker.NewNames(setup.Prefix).GrantsBucket())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Get(ctx, "alice"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("alice's grant: %v", err)
	}
	nc, err := nats.Connect(env.URL, nats.UserCredentials(copyPath), nats.MaxReconnects(0))
	if err == nil {
		nc.Close()
		t.Fatal("revoked credentials connected")
	}
	// And after a restart, from what the server kept.
	env.Restart(t)
	if nc, err := nats.Connect(env.URL, nats.UserCredentials(copyPath), nats.MaxReconnects(0)); err == nil {
		nc.Close()
		t.Fatal("revoked credentials connected after a restart")
	}
	if again, err := auth.Load(setup.Dir); err != nil || len(again.Principals) != 4 || len(again.Removed) != 1 {
		t.Fatalf("setup after removal: %v, %d principals", err, len(again.Principals))
	}
}
