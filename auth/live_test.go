package auth_test

import (
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/capstan-dev/capstan/auth"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
)

// Principals come and go on a running deployment by a push, with no
// restart: one added connects to every node and calls; one removed is
// disconnected from every node at once and connects nowhere again.
func TestLivePrincipals_AddedAndRemovedByPush(t *testing.T) {
	t.Parallel()
	testLivePrincipals(t, newRigOn(t, embedded))
}

func TestLivePrincipalsOnOfficialServer_AddedAndRemovedByPush(t *testing.T) {
	t.Parallel()
	testLivePrincipals(t, newRigOn(t, official))
}

func TestLivePrincipalsOnCluster_AddedAndRemovedByPushOnEveryNode(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("3-node cluster")
	}
	testLivePrincipals(t, newRigOn(t, cluster))
}

func testLivePrincipals(t *testing.T, r *rig) {
	ctx := testCtx(t)
	if err := r.setup.Add(auth.Grant{Principal: "erin", Role: auth.RoleProducer, Actors: []string{"user:erin"}, Capabilities: []string{"t.echo"}}); err != nil {
		t.Fatal(err)
	}
	creds := r.setup.CredsPath("erin")
	dial := func(url string, opts ...nats.Option) (*nats.Conn, error) {
		return nats.Connect(url, append([]nats.Option{nats.UserCredentials(creds),
			nats.CustomInboxPrefix(broker.NewNames(r.setup.Prefix).InboxPrefix("erin")), nats.NoReconnect()}, opts...)...)
	}
	for _, url := range r.nodes {
		if nc, err := dial(url); err == nil {
			nc.Close()
			t.Fatalf("erin connected to %s before her account was pushed", url)
		}
	}
	r.push(t)
	if err := auth.PublishGrants(ctx, r.admin.JS, r.setup, 0); err != nil {
		t.Fatal(err)
	}
	closed := make(chan string, len(r.nodes))
	var conns []*nats.Conn
	for _, url := range r.nodes {
		nc, err := dial(url, nats.ClosedHandler(func(*nats.Conn) { closed <- url }))
		if err != nil {
			t.Fatalf("erin, pushed, cannot connect to %s: %v", url, err)
		}
		t.Cleanup(nc.Close)
		conns = append(conns, nc)
		c, err := executor.NewClient(nc, executor.ClientConfig{Actor: envelope.Actor{Kind: "user", ID: "erin"}})
		if err != nil {
			t.Fatal(err)
		}
		env, err := c.Call(ctx, "t.echo", Echo{Text: "erin on " + url})
		_ = c.Close()
		if err != nil || env.Status != envelope.StatusCompleted {
			t.Fatalf("erin's call through %s: %v %+v", url, err, env)
		}
	}

	if err := r.setup.Remove("erin"); err != nil {
		t.Fatal(err)
	}
	r.push(t)
	for range conns {
		select {
		case <-closed:
		case <-ctx.Done():
			t.Fatalf("erin's connections outlived the push of her removal: %d of %d closed", len(closed), len(conns))
		}
	}
	for _, url := range r.nodes {
		if nc, err := dial(url); err == nil {
			nc.Close()
			t.Fatalf("erin, removed, connected to %s", url)
		}
	}
	// Everyone else is unaffected.
	bob, _, _ := r.client(t, "bob", executor.SurfaceDirect)
	if env, err := bob.Call(ctx, "t.echo", Echo{Text: "bob"}); err != nil || env.Status != envelope.StatusCompleted {
		t.Fatalf("%v %+v", err, env)
	}
}
